//! The address ranges of the `ipam` section: the short form and `ranges`
//! (host-local's two ways of saying them), exclusions, and the check that
//! no two range sets overlap.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use super::{RANGE_KEYS, family, parse_cidr, parse_ip, string_field, unknown_key};
use crate::allocator::{Exclusions, Range, RangeSet, to_u128};
use flatnet_cni::error::{Error, Result};

/// The range sets, each with the path of its first field (for messages):
/// the short form (`subnet`, ...) comes first, then `ranges`, as host-local does.
pub(super) fn range_sets(ipam: &Map<String, Value>) -> Result<Vec<(RangeSet, String)>> {
    let mut sets = Vec::new();
    if ipam.contains_key("subnet") && !ipam["subnet"].is_null() {
        let range = parse_range(ipam, "ipam")?;
        sets.push((
            RangeSet {
                ranges: vec![range],
            },
            "ipam".to_string(),
        ));
    } else {
        for key in ["gateway", "rangeStart", "rangeEnd"] {
            if ipam.get(key).is_some_and(|v| !v.is_null()) {
                return Err(Error::config(format!(
                    "ipam.{key} is given without ipam.subnet: add \"subnet\" or move it into \"ranges\""
                )));
            }
        }
    }
    match ipam.get("ranges") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            if list.is_empty() && sets.is_empty() {
                return Err(Error::config(
                    "ipam.ranges is empty: give at least one range set, e.g. [[{\"subnet\": \"10.42.0.0/16\"}]]",
                ));
            }
            for (i, set) in list.iter().enumerate() {
                let path = format!("ipam.ranges[{i}]");
                let Value::Array(ranges) = set else {
                    return Err(Error::config(format!(
                        "{path}: must be a list of ranges (a range set), e.g. [{{\"subnet\": \"10.42.0.0/16\"}}]"
                    )));
                };
                if ranges.is_empty() {
                    return Err(Error::config(format!(
                        "{path}: a range set needs at least one range"
                    )));
                }
                let mut parsed: Vec<Range> = Vec::with_capacity(ranges.len());
                for (j, range) in ranges.iter().enumerate() {
                    let path = format!("{path}[{j}]");
                    let Value::Object(map) = range else {
                        return Err(Error::config(format!(
                            "{path}: must be an object such as {{\"subnet\": \"10.42.0.0/16\"}}"
                        )));
                    };
                    for key in map.keys() {
                        if !RANGE_KEYS.contains(&key.as_str()) {
                            return Err(unknown_key(
                                &format!("{path}.{key}"),
                                &map[key],
                                RANGE_KEYS,
                            ));
                        }
                    }
                    if map.get("subnet").is_none_or(Value::is_null) {
                        return Err(Error::config(format!(
                            "{path}.subnet is missing: every range needs a subnet such as \"10.42.0.0/16\""
                        )));
                    }
                    let range = parse_range(map, &path)?;
                    if let Some(first) = parsed.first()
                        && first.is_ipv6() != range.is_ipv6()
                    {
                        return Err(Error::config(format!(
                            "{path}.subnet: {} is {} but range set {i} is {}; put each address family in its own range set",
                            range.subnet,
                            family(range.subnet.ip()),
                            family(first.subnet.ip())
                        )));
                    }
                    parsed.push(range);
                }
                sets.push((RangeSet { ranges: parsed }, path));
            }
        }
        Some(other) => {
            return Err(Error::config(format!(
                "ipam.ranges: {other} must be a list of range sets, e.g. [[{{\"subnet\": \"10.42.0.0/16\"}}]]"
            )));
        }
    }
    if sets.is_empty() {
        return Err(Error::config(
            "ipam has no addresses: give \"subnet\" (and optionally \"gateway\", \"rangeStart\", \"rangeEnd\") or \"ranges\"",
        ));
    }
    Ok(sets)
}

/// One range: `subnet` and optional `rangeStart`, `rangeEnd`, `gateway`.
fn parse_range(map: &Map<String, Value>, path: &str) -> Result<Range> {
    let field = |key: &str| format!("{path}.{key}");
    let subnet_text = string_field(map, "subnet", path)?.unwrap_or_default();
    let subnet = parse_cidr(subnet_text, &field("subnet"), true)?;
    let max = if subnet.is_ipv6() { 128 } else { 32 };
    if subnet.prefix() > max - 2 {
        return Err(Error::config(format!(
            "{}: {subnet} is too small to allocate from; use at most a /{} ",
            field("subnet"),
            max - 2
        )));
    }
    let first = crate::allocator::from_u128(subnet.is_ipv6(), to_u128(subnet.network()) + 1);
    let last = if subnet.is_ipv6() {
        subnet.broadcast()
    } else {
        crate::allocator::from_u128(false, to_u128(subnet.broadcast()) - 1)
    };
    let address = |key: &str, default: IpAddr| -> Result<IpAddr> {
        let Some(text) = string_field(map, key, path)? else {
            return Ok(default);
        };
        let ip = parse_ip(text, &field(key))?;
        if ip.is_ipv6() != subnet.is_ipv6() {
            return Err(Error::config(format!(
                "{}: {ip} is {} but the subnet {subnet} is {}; give an address of the subnet",
                field(key),
                family(ip),
                family(subnet.ip())
            )));
        }
        if !subnet.contains(ip) {
            return Err(Error::config(format!(
                "{}: {ip} is outside the subnet {subnet}; pick an address inside it",
                field(key)
            )));
        }
        Ok(ip)
    };
    let start = address("rangeStart", first)?;
    let end = address("rangeEnd", last)?;
    let gateway = address("gateway", first)?;
    if to_u128(start) > to_u128(end) {
        return Err(Error::config(format!(
            "{}: {start} is after rangeEnd {end}; swap them or fix one",
            field("rangeStart")
        )));
    }
    if gateway == subnet.network() {
        return Err(Error::config(format!(
            "{}: {gateway} is the network address of {subnet}; use a host address such as {first}",
            field("gateway")
        )));
    }
    if !subnet.is_ipv6() && gateway == subnet.broadcast() {
        return Err(Error::config(format!(
            "{}: {gateway} is the broadcast address of {subnet}; use a host address such as {first}",
            field("gateway")
        )));
    }
    Ok(Range {
        subnet,
        start,
        end,
        gateway,
    })
}

/// Ranges must not share addresses, within a set or across sets.
pub(super) fn check_overlaps(sets: &[(RangeSet, String)]) -> Result<()> {
    let mut all: Vec<(&Range, String)> = Vec::new();
    for (set, path) in sets {
        for (j, range) in set.ranges.iter().enumerate() {
            // The short form's set path is plain "ipam"; a full-form set's is "ipam.ranges[i]".
            let path = if path == "ipam" {
                path.clone()
            } else {
                format!("{path}[{j}]")
            };
            all.push((range, path));
        }
    }
    for (k, (a, a_path)) in all.iter().enumerate() {
        for (b, b_path) in &all[..k] {
            let overlap = a.is_ipv6() == b.is_ipv6()
                && to_u128(a.start) <= to_u128(b.end)
                && to_u128(b.start) <= to_u128(a.end);
            if overlap {
                return Err(Error::config(format!(
                    "{a_path}: {}-{} overlaps {b_path} ({}-{}); ranges must not share addresses",
                    a.start, a.end, b.start, b.end
                )));
            }
        }
    }
    Ok(())
}

pub(super) fn exclusions(ipam: &Map<String, Value>) -> Result<Exclusions> {
    let list = match ipam.get("exclude") {
        None | Some(Value::Null) => return Ok(Exclusions::default()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(Error::config(format!(
                "ipam.exclude: {other} must be a list of addresses or CIDRs, e.g. [\"10.42.0.10\", \"10.42.1.0/24\"]"
            )));
        }
    };
    let mut networks = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let field = format!("ipam.exclude[{i}]");
        let Value::String(text) = entry else {
            return Err(Error::config(format!(
                "{field}: {entry} must be a string address or CIDR"
            )));
        };
        let network = if text.contains('/') {
            parse_cidr(text, &field, true)?
        } else {
            let ip = text.parse::<IpAddr>().map_err(|_| {
                Error::config(format!(
                    "{field}: {text:?} is neither an IP address nor a CIDR; write it like 10.42.0.10 or 10.42.1.0/24"
                ))
            })?;
            IpNetwork::from(ip)
        };
        networks.push(network);
    }
    Ok(Exclusions::new(&networks))
}

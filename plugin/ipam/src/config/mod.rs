//! The configuration flatnet-ipam reads from stdin: the top-level keys it
//! needs and the `ipam` section, validated into an address [`Plan`] before
//! the store is touched. Every refusal names the field and what to fix.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnetwork::IpNetwork;
use serde::Deserialize;
use serde_json::{Map, Value};

mod ranges;

use crate::allocator::Plan;
use flatnet_cni::config::{check_stdin, validate_network_name};
use flatnet_cni::error::{Error, Result};
use flatnet_cni::result::{CniResult, Dns, Route};
use flatnet_cni::runtime::Attachment;
use flatnet_cni::version::SpecVersion;
use ranges::{check_overlaps, exclusions, range_sets};

/// Where allocations live unless `ipam.dataDir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/flatnet-ipam";

/// Keys of the `ipam` section; anything else is refused (code 2) so a typo
/// such as `rangestart` does not silently hand out the wrong addresses.
const IPAM_KEYS: &[&str] = &[
    "type",
    "subnet",
    "gateway",
    "rangeStart",
    "rangeEnd",
    "ranges",
    "routes",
    "dataDir",
    "exclude",
    "dns",
    "fsync",
];
const RANGE_KEYS: &[&str] = &["subnet", "rangeStart", "rangeEnd", "gateway"];

/// The top-level keys flatnet-ipam reads; the rest belongs to other plugins.
#[derive(Debug, Deserialize)]
struct RawConf {
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    #[serde(default)]
    name: String,
    ipam: Option<Value>,
    args: Option<Value>,
    #[serde(rename = "runtimeConfig")]
    runtime_config: Option<Value>,
    #[serde(rename = "prevResult")]
    prev_result: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
    #[serde(rename = "logFile")]
    log_file: Option<PathBuf>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct IpamConf {
    pub version: SpecVersion,
    pub name: String,
    pub plan: Plan,
    pub routes: Vec<Route>,
    pub dns: Dns,
    /// `<dataDir>/<network name>`: this network's allocations.
    pub dir: PathBuf,
    /// Flush every record to disk before answering (off: see the store docs).
    pub fsync: bool,
    /// Addresses asked for in `args.cni.ips` and `runtimeConfig.ips`.
    pub requested: Vec<IpAddr>,
    /// GC: the attachments to keep (required, and checked, by GC only).
    pub valid_attachments: Option<Vec<Attachment>>,
    pub prev_result: Option<CniResult>,
    pub log_file: Option<PathBuf>,
}

/// The first parsing stage: enough to answer in the right version.
pub struct Parsed {
    raw: RawConf,
    pub version: SpecVersion,
    pub log_file: Option<PathBuf>,
}

impl IpamConf {
    /// Reads stdin and the spec version; [`Parsed::validate`] does the rest,
    /// so errors found there are already reported in the config's version.
    pub fn read(stdin: &[u8]) -> Result<Parsed> {
        check_stdin(stdin)?;
        let raw: RawConf =
            serde_json::from_slice(stdin).map_err(|e| Error::decode("network configuration", e))?;
        let version = SpecVersion::parse(&raw.cni_version)?;
        Ok(Parsed {
            version,
            log_file: raw.log_file.clone(),
            raw,
        })
    }

    pub fn parse(stdin: &[u8]) -> Result<Self> {
        Self::read(stdin)?.validate()
    }
}

impl Parsed {
    pub fn validate(self) -> Result<IpamConf> {
        let raw = self.raw;
        validate_network_name(&raw.name)?;
        let ipam = match raw.ipam {
            Some(Value::Object(map)) => map,
            Some(_) => return Err(Error::config("\"ipam\" must be an object")),
            None => {
                return Err(Error::config(
                    "\"ipam\" is missing: give {\"type\": \"flatnet-ipam\", \"subnet\": \"10.42.0.0/16\"}",
                ));
            }
        };
        for key in ipam.keys() {
            if !IPAM_KEYS.contains(&key.as_str()) {
                return Err(unknown_key(&format!("ipam.{key}"), &ipam[key], IPAM_KEYS));
            }
        }
        let sets = range_sets(&ipam)?;
        let exclude = exclusions(&ipam)?;
        check_overlaps(&sets)?;
        let plan = Plan::new(sets.iter().map(|(set, _)| set.clone()).collect(), exclude);
        for (index, (set, path)) in sets.iter().enumerate() {
            if plan.capacity(index) == 0 {
                return Err(Error::config(format!(
                    "{path}: range set {index} ({set}) has no address to hand out once gateways, network/broadcast and excluded addresses are left out; widen it or shrink \"ipam.exclude\""
                )));
            }
        }
        let routes = routes(&ipam)?;
        let dns = match ipam.get("dns") {
            None | Some(Value::Null) => Dns::default(),
            Some(value) => serde_json::from_value(value.clone()).map_err(|e| {
                Error::config(format!(
                    "ipam.dns: {e}; expected {{\"nameservers\": [...], \"domain\": \"...\", \"search\": [...], \"options\": [...]}}"
                ))
            })?,
        };
        let data_dir = match ipam.get("dataDir") {
            None | Some(Value::Null) => PathBuf::from(DEFAULT_DATA_DIR),
            Some(Value::String(dir)) if dir.starts_with('/') => PathBuf::from(dir),
            Some(other) => {
                return Err(Error::config(format!(
                    "ipam.dataDir: {other} must be an absolute path such as {DEFAULT_DATA_DIR:?}"
                )));
            }
        };
        let fsync = match ipam.get("fsync") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(Error::config(format!(
                    "ipam.fsync: {other} must be true or false"
                )));
            }
        };
        let mut requested = Vec::new();
        if let Some(ips) = raw
            .args
            .as_ref()
            .and_then(|args| args.get("cni"))
            .and_then(|cni| cni.get("ips"))
        {
            requested.extend(requested_ips(ips, "args.cni.ips")?);
        }
        if let Some(ips) = raw.runtime_config.as_ref().and_then(|rc| rc.get("ips")) {
            requested.extend(requested_ips(ips, "runtimeConfig.ips")?);
        }
        let prev_result = raw
            .prev_result
            .as_ref()
            .map(|value| CniResult::from_value(value, "prevResult"))
            .transpose()?;
        Ok(IpamConf {
            version: self.version,
            dir: data_dir.join(&raw.name),
            name: raw.name,
            plan,
            routes,
            dns,
            fsync,
            requested,
            valid_attachments: raw.valid_attachments,
            prev_result,
            log_file: raw.log_file,
        })
    }
}

fn unknown_key(field: &str, value: &Value, known: &[&str]) -> Error {
    Error::UnsupportedField {
        field: field.to_string(),
        value: value.to_string(),
        hint: format!(
            "flatnet-ipam does not know this key; use {}",
            known.join(", ")
        ),
    }
}

/// An optional string field of `map`; `path` names it in errors.
fn string_field<'a>(map: &'a Map<String, Value>, key: &str, path: &str) -> Result<Option<&'a str>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(Error::config(format!(
            "{path}.{key}: {other} must be a string"
        ))),
    }
}

/// A CIDR with an explicit prefix; host bits must be clear when `network`.
fn parse_cidr(text: &str, field: &str, network: bool) -> Result<IpNetwork> {
    if !text.contains('/') {
        return Err(Error::config(format!(
            "{field}: {text:?} has no prefix length; write a CIDR such as 10.42.0.0/16 or fd00:42::/64"
        )));
    }
    let cidr: IpNetwork = text.parse().map_err(|e| {
        Error::config(format!(
            "{field}: {text:?} is not a CIDR ({e}); write it like 10.42.0.0/16 or fd00:42::/64"
        ))
    })?;
    if network && cidr.ip() != cidr.network() {
        return Err(Error::config(format!(
            "{field}: {text} has host bits set; the network is {}/{}",
            cidr.network(),
            cidr.prefix()
        )));
    }
    Ok(cidr)
}

fn parse_ip(text: &str, field: &str) -> Result<IpAddr> {
    text.parse().map_err(|_| {
        Error::config(format!(
            "{field}: {text:?} is not an IP address; write it like 10.42.0.10 or fd00:42::10"
        ))
    })
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv6() { "IPv6" } else { "IPv4" }
}

fn routes(ipam: &Map<String, Value>) -> Result<Vec<Route>> {
    let list = match ipam.get("routes") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(Error::config(format!(
                "ipam.routes: {other} must be a list such as [{{\"dst\": \"0.0.0.0/0\"}}]"
            )));
        }
    };
    let mut routes = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let field = format!("ipam.routes[{i}]");
        let Some(Value::String(dst)) = entry.get("dst") else {
            return Err(Error::config(format!(
                "{field}.dst is missing: give a destination CIDR such as \"0.0.0.0/0\""
            )));
        };
        parse_cidr(dst, &format!("{field}.dst"), false)?;
        if let Some(gw) = entry.get("gw").filter(|gw| !gw.is_null()) {
            match gw {
                Value::String(text) => {
                    parse_ip(text, &format!("{field}.gw"))?;
                }
                other => {
                    return Err(Error::config(format!(
                        "{field}.gw: {other} must be an IP address string"
                    )));
                }
            }
        }
        let route: Route = serde_json::from_value(entry.clone())
            .map_err(|e| Error::config(format!("{field}: {e}")))?;
        if let Some(gw) = route.gw
            && gw.is_ipv6() != route.dst.is_ipv6()
        {
            return Err(Error::config(format!(
                "{field}.gw: {gw} is {} but dst {} is {}",
                family(gw),
                route.dst,
                family(route.dst.ip())
            )));
        }
        routes.push(route);
    }
    Ok(routes)
}

/// `["10.42.0.5", "fd00::5/64"]`: a prefix length, if given, is ignored.
fn requested_ips(value: &Value, field: &str) -> Result<Vec<IpAddr>> {
    let Value::Array(list) = value else {
        return Err(Error::config(format!(
            "{field}: {value} must be a list of addresses such as [\"10.42.0.5\"]"
        )));
    };
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            let field = format!("{field}[{i}]");
            let Value::String(text) = entry else {
                return Err(Error::config(format!("{field}: {entry} must be a string")));
            };
            let ip = text.split_once('/').map_or(text.as_str(), |(ip, _)| ip);
            parse_ip(ip, &field)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(ipam: Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": "pods", "type": "bridge", "ipam": ipam})
    }

    fn parse(value: Value) -> Result<IpamConf> {
        IpamConf::parse(value.to_string().as_bytes())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_short_form_gets_host_local_defaults() {
        let c = parse(conf(
            json!({"type": "flatnet-ipam", "subnet": "10.42.0.0/16"}),
        ))
        .unwrap();
        let range = &c.plan.sets[0].ranges[0];
        assert_eq!(range.gateway, ip("10.42.0.1"));
        assert_eq!(range.start, ip("10.42.0.1"));
        assert_eq!(range.end, ip("10.42.255.254"));
        assert_eq!(c.dir, PathBuf::from("/var/lib/cni/flatnet-ipam/pods"));
        assert!(c.fsync, "records are flushed unless the config opts out");
        assert_eq!(c.plan.capacity(0), 65533);
        assert_eq!(c.plan.next_free(0, None, |_| false), Some(ip("10.42.0.2")));
    }

    #[test]
    fn the_full_form_gives_dual_stack_and_everything_else_is_read() {
        let c = parse(json!({
            "cniVersion": "1.1.0", "name": "dual", "type": "bridge",
            "ipam": {
                "type": "flatnet-ipam",
                "ranges": [
                    [{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20", "gateway": "10.1.0.254"},
                     {"subnet": "10.2.0.0/24"}],
                    [{"subnet": "fd00:1::/64"}]
                ],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00:1::1"}],
                "exclude": ["10.1.0.15", "10.2.0.0/28"],
                "dataDir": "/tmp/x",
                "dns": {"nameservers": ["10.1.0.53"], "search": ["svc"]},
                "fsync": true
            },
            "args": {"cni": {"ips": ["10.1.0.12", "fd00:1::9/64"]}},
            "runtimeConfig": {"ips": ["10.2.0.40/24"]},
            "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]
        }))
        .unwrap();
        assert_eq!(c.plan.sets.len(), 2);
        assert_eq!(c.plan.sets[0].ranges.len(), 2);
        assert_eq!(c.plan.sets[0].ranges[0].gateway, ip("10.1.0.254"));
        assert_eq!(
            c.plan.sets[1].ranges[0].end,
            ip("fd00:1::ffff:ffff:ffff:ffff")
        );
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.dns.search, vec!["svc"]);
        assert_eq!(c.dir, PathBuf::from("/tmp/x/dual"));
        assert!(c.fsync);
        assert_eq!(
            c.requested,
            vec![ip("10.1.0.12"), ip("fd00:1::9"), ip("10.2.0.40")]
        );
        assert_eq!(
            c.valid_attachments,
            Some(vec![Attachment {
                container_id: "a".into(),
                ifname: "eth0".into()
            }])
        );
        // 10 addresses minus the excluded .15; the second range loses .0/28 and .255.
        assert_eq!(c.plan.capacity(0), 10 + 254 - 15);
        assert_eq!(c.version, SpecVersion::V1_1_0);
    }

    #[test]
    fn short_form_and_ranges_combine_short_form_first() {
        let c = parse(conf(json!({
            "type": "flatnet-ipam", "subnet": "10.1.0.0/24",
            "ranges": [[{"subnet": "fd00::/64"}]]
        })))
        .unwrap();
        assert_eq!(c.plan.sets.len(), 2);
        assert!(c.plan.sets[1].is_ipv6());
    }

    #[test]
    fn invalid_configs_get_code_7_naming_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"subnet": "10.0.0.300/24"}), "ipam.subnet"),
            (json!({"subnet": "10.0.0.0"}), "no prefix length"),
            (json!({"subnet": "10.0.0.5/24"}), "host bits"),
            (json!({"subnet": "10.0.0.0/31"}), "too small"),
            (json!({"subnet": "fd00::/127"}), "too small"),
            (json!({"subnet": 42}), "ipam.subnet"),
            (
                json!({"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}),
                "ipam.gateway: 10.0.1.1 is outside",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "gateway": "10.0.0.0"}),
                "network address",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "gateway": "10.0.0.255"}),
                "broadcast address",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.3"}),
                "ipam.rangeStart: 10.0.0.9 is after rangeEnd",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.3"}),
                "ipam.rangeEnd",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "nope"}),
                "ipam.rangeStart",
            ),
            (json!({"gateway": "10.0.0.1"}), "without ipam.subnet"),
            (json!({}), "give \"subnet\""),
            (json!({"ranges": []}), "ipam.ranges is empty"),
            (json!({"ranges": [[]]}), "ipam.ranges[0]: a range set"),
            (
                json!({"ranges": [{"subnet": "10.0.0.0/24"}]}),
                "ipam.ranges[0]: must be a list",
            ),
            (
                json!({"ranges": [[{"gateway": "10.0.0.1"}]]}),
                "ipam.ranges[0][0].subnet is missing",
            ),
            (
                json!({"ranges": [[{"subnet": "fd00::/64", "rangeStart": "10.0.0.5"}]]}),
                "ipam.ranges[0][0].rangeStart: 10.0.0.5 is IPv4 but the subnet fd00::/64 is IPv6",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}),
                "ipam.ranges[0][1].subnet: fd00::/64 is IPv6 but range set 0 is IPv4",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25", "rangeStart": "10.0.0.100"}]]}),
                "ipam.ranges[0][1]: 10.0.0.100-10.0.0.126 overlaps ipam.ranges[0][0]",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.128/25"}]]}),
                "ipam.ranges[1][0]",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.200"}]]}),
                "ipam.ranges[0][0]: 10.0.0.200-10.0.0.254 overlaps ipam",
            ),
            (
                json!({"subnet": "10.0.0.0/30", "exclude": ["10.0.0.2"]}),
                "no address to hand out",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "exclude": ["10.0.0.x"]}),
                "ipam.exclude[0]",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "exclude": ["10.0.0.1/24"]}),
                "ipam.exclude[0]: 10.0.0.1/24 has host bits",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "exclude": "10.0.0.1"}),
                "ipam.exclude",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "routes": [{"gw": "10.0.0.1"}]}),
                "ipam.routes[0].dst is missing",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]}),
                "ipam.routes[0].gw",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "banana"}]}),
                "ipam.routes[0].dst",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "dataDir": "relative/dir"}),
                "ipam.dataDir",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "dns": {"nameservers": "x"}}),
                "ipam.dns",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "fsync": "yes"}),
                "ipam.fsync",
            ),
        ];
        for (ipam, needle) in cases {
            let err = parse(conf(ipam.clone())).unwrap_err();
            assert_eq!(err.code(), 7, "{ipam}: {err}");
            assert!(
                err.to_string().contains(needle),
                "{ipam}: {err} lacks {needle:?}"
            );
        }
    }

    #[test]
    fn unknown_keys_get_code_2() {
        let err = parse(conf(
            json!({"subnet": "10.0.0.0/24", "rangestart": "10.0.0.5"}),
        ))
        .unwrap_err();
        assert_eq!(err.code(), 2);
        assert!(err.to_string().contains("ipam.rangestart"), "{err}");
        let err = parse(conf(
            json!({"ranges": [[{"subnet": "10.0.0.0/24", "gw": "10.0.0.1"}]]}),
        ))
        .unwrap_err();
        assert_eq!(err.code(), 2);
        assert!(err.to_string().contains("ipam.ranges[0][0].gw"), "{err}");
    }

    #[test]
    fn top_level_problems() {
        let mut c = conf(json!({"subnet": "10.0.0.0/24"}));
        c["name"] = json!("");
        assert_eq!(parse(c.clone()).unwrap_err().code(), 7);
        c["name"] = json!("../etc");
        assert_eq!(parse(c.clone()).unwrap_err().code(), 7);
        c["name"] = json!("ok");
        c["cniVersion"] = json!("0.2.0");
        assert_eq!(parse(c.clone()).unwrap_err().code(), 1);
        c["cniVersion"] = json!("1.0.0");
        c["args"] = json!({"cni": {"ips": ["10.0.0.x"]}});
        let err = parse(c.clone()).unwrap_err();
        assert!(err.to_string().contains("args.cni.ips[0]"), "{err}");
        c["args"] = json!(null);
        c["cni.dev/valid-attachments"] = json!([{"containerID": "a"}]);
        let err = parse(c.clone()).unwrap_err();
        assert_eq!(err.code(), 6, "{err}");
        assert!(err.to_string().contains("ifname"), "{err}");
        let mut c = conf(json!(null));
        c.as_object_mut().unwrap().remove("ipam");
        assert_eq!(parse(c).unwrap_err().code(), 7);
        assert_eq!(IpamConf::parse(b"").unwrap_err().code(), 6);
        assert_eq!(IpamConf::parse(b"{").unwrap_err().code(), 6);
    }
}

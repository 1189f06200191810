//! How policy rules are keyed and valued in the maps: LPM keys per pod
//! slot and direction, port sets as map values and back, local-address
//! keys, and the checks on slots and prefixes.

use std::net::IpAddr;

use flatnet_common::PolicyPorts as PortsValue;
use flatnet_common::{
    LocalAddrKey, POLICY_KEY_FIXED_BITS, POLICY_MAX_RANGES, PolicyCidrV4, PolicyCidrV6, PolicyRange,
};
use ipnetwork::IpNetwork;

use super::{PolicyPortRange, PolicyPorts, PolicyRule};
use aya::maps::lpm_trie::Key as LpmKey;
use flatnet_common::{MAX_ENDPOINTS, NO_COUNTER_SLOT};

use crate::error::{Error, Result};

/// The map value of `ports`; an error when it holds too many ranges.
pub fn ports_value(cidr: &impl std::fmt::Display, ports: &PolicyPorts) -> Result<PortsValue> {
    let mut value = PortsValue::default();
    match ports {
        PolicyPorts::Any => value.any = 1,
        PolicyPorts::Ranges(ranges) => {
            if ranges.len() > POLICY_MAX_RANGES {
                return Err(Error::Datapath(format!(
                    "the policy entry for {cidr} has {} port ranges; an entry holds at most {POLICY_MAX_RANGES}",
                    ranges.len()
                )));
            }
            for (slot, range) in value.ranges.iter_mut().zip(ranges) {
                if range.first > range.last {
                    return Err(Error::Datapath(format!(
                        "the policy entry for {cidr} has the empty port range {}-{}",
                        range.first, range.last
                    )));
                }
                *slot = PolicyRange {
                    protocol: range.protocol,
                    _pad: 0,
                    first: range.first,
                    last: range.last,
                };
            }
            value.count = ranges.len() as u8;
        }
    }
    Ok(value)
}

pub(super) fn key_v4(
    slot: u32,
    direction: u32,
    net: &ipnetwork::Ipv4Network,
) -> LpmKey<PolicyCidrV4> {
    LpmKey::new(
        POLICY_KEY_FIXED_BITS + u32::from(net.prefix()),
        PolicyCidrV4 {
            slot,
            direction,
            address: net.network().octets(),
        },
    )
}

pub(super) fn key_v6(
    slot: u32,
    direction: u32,
    net: &ipnetwork::Ipv6Network,
) -> LpmKey<PolicyCidrV6> {
    LpmKey::new(
        POLICY_KEY_FIXED_BITS + u32::from(net.prefix()),
        PolicyCidrV6 {
            slot,
            direction,
            address: net.network().octets(),
        },
    )
}

/// A node address as `LOCAL_ADDRS` keys it (IPv4 mapped into IPv6).
pub fn local_addr_key(address: IpAddr) -> LocalAddrKey {
    match address {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// An address of either family, as keyed.
#[derive(Clone, Copy)]
pub(super) enum Address {
    V4([u8; 4]),
    V6([u8; 16]),
}

pub(super) fn check_slot(slot: u32) -> Result<()> {
    if slot == NO_COUNTER_SLOT || slot >= MAX_ENDPOINTS {
        return Err(Error::Datapath(format!(
            "{slot} is no pod's counter slot (1..{MAX_ENDPOINTS})"
        )));
    }
    Ok(())
}

pub(super) fn policy_network(address: IpAddr, prefix_len: u32) -> Result<IpNetwork> {
    let prefix = prefix_len
        .checked_sub(POLICY_KEY_FIXED_BITS)
        .and_then(|p| u8::try_from(p).ok())
        .unwrap_or(u8::MAX);
    IpNetwork::new(address, prefix)
        .map_err(|e| Error::Datapath(format!("a policy key is malformed: {e}")))
}

pub(super) fn rule_of(cidr: IpNetwork, value: &PortsValue) -> PolicyRule {
    PolicyRule {
        cidr,
        ports: ports_of(value),
    }
}

/// What a map value allows.
pub(super) fn ports_of(value: &PortsValue) -> PolicyPorts {
    if value.any != 0 {
        PolicyPorts::Any
    } else {
        PolicyPorts::Ranges(
            value
                .ranges
                .iter()
                .take(usize::from(value.count).min(POLICY_MAX_RANGES))
                .map(|r| PolicyPortRange {
                    protocol: r.protocol,
                    first: r.first,
                    last: r.last,
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_sets_become_map_values() {
        let cidr: IpNetwork = "10.0.0.0/8".parse().unwrap();
        let any = ports_value(&cidr, &PolicyPorts::Any).unwrap();
        assert_eq!((any.any, any.count), (1, 0));
        let deny = ports_value(&cidr, &PolicyPorts::Ranges(vec![])).unwrap();
        assert_eq!((deny.any, deny.count), (0, 0));
        let ranges = vec![
            PolicyPortRange {
                protocol: 6,
                first: 80,
                last: 80,
            },
            PolicyPortRange {
                protocol: 17,
                first: 53,
                last: 54,
            },
        ];
        let value = ports_value(&cidr, &PolicyPorts::Ranges(ranges.clone())).unwrap();
        assert_eq!(value.count, 2);
        assert_eq!(
            (
                value.ranges[1].protocol,
                value.ranges[1].first,
                value.ranges[1].last
            ),
            (17, 53, 54)
        );
        assert_eq!(rule_of(cidr, &value).ports, PolicyPorts::Ranges(ranges));
        let too_many = vec![
            PolicyPortRange {
                protocol: 6,
                first: 1,
                last: 1,
            };
            POLICY_MAX_RANGES + 1
        ];
        assert!(ports_value(&cidr, &PolicyPorts::Ranges(too_many)).is_err());
    }

    #[test]
    fn local_addresses_are_keyed_in_one_family() {
        assert_eq!(
            local_addr_key("192.168.1.2".parse().unwrap()),
            "::ffff:192.168.1.2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert_eq!(
            policy_network(IpAddr::from([10, 0, 0, 0]), 64 + 8).unwrap(),
            "10.0.0.0/8".parse::<IpNetwork>().unwrap()
        );
    }
}

//! Flattening the rules that apply to one pod and direction into a
//! longest-prefix-match table, the shape of a BPF LPM trie: for any
//! address, the longest entry containing it gives exactly the union of the
//! ports of every rule that allows the address, and an address no entry
//! contains is denied.
//!
//! Why it works: every CIDR a rule mentions (its own, and those of its
//! `except` list) becomes a candidate entry. CIDRs either nest or are
//! disjoint, so for an address A whose longest candidate is P, a rule's
//! CIDR or except contains A exactly when it contains P. Whether a rule
//! allows A is therefore the same for every address whose longest candidate
//! is P, and P's value is the union over the rules that allow P.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use super::ports::{MAX_PORT_RANGES, PortSet};

/// What one rule allows for one peer: the addresses in `cidr` but in none
/// of `except`, on `ports`. `policy` names where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow<'a> {
    pub cidr: IpNetwork,
    pub except: Vec<IpNetwork>,
    pub ports: PortSet,
    pub policy: &'a str,
}

/// One entry of a [`Table`]: a prefix and what it allows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub cidr: IpNetwork,
    pub ports: PortSet,
}

/// What one rule allows for the pods of one identity (see `identity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAllow<'a> {
    pub identity: u32,
    pub ports: PortSet,
    pub policy: &'a str,
}

/// A longest-prefix-match table, entries sorted by CIDR (IPv4 first, a
/// prefix before the longer ones inside it) with host bits cleared, and
/// what the pods of each identity may use. A peer is allowed what the
/// longest entry containing its address allows together with what its
/// identity's entry allows.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Table {
    pub entries: Vec<Entry>,
    /// Identity number -> ports.
    pub peers: BTreeMap<u32, PortSet>,
}

impl Table {
    /// What the longest entry containing `addr` allows; None: no entry.
    pub fn lookup(&self, addr: IpAddr) -> Option<&PortSet> {
        self.entries
            .iter()
            .filter(|e| e.cidr.contains(addr))
            .max_by_key(|e| e.cidr.prefix())
            .map(|e| &e.ports)
    }

    /// Whether a packet of IP protocol `protocol` to `port` with `addr`
    /// (of identity `identity`, if it has one) on the far side is allowed.
    pub fn allows(&self, addr: IpAddr, identity: Option<u32>, protocol: u8, port: u16) -> bool {
        let by_identity = identity.and_then(|i| self.peers.get(&i));
        self.lookup(addr)
            .into_iter()
            .chain(by_identity)
            .any(|p| p.allows(protocol, port))
    }
}

/// Identity number -> the union of what `allows` give it. Fails on the
/// first identity (by number) with more than [`MAX_PORT_RANGES`] ranges.
pub fn peer_ports(allows: &[PeerAllow<'_>]) -> Result<BTreeMap<u32, PortSet>, Overflow> {
    let mut by_identity: BTreeMap<u32, Vec<&PeerAllow<'_>>> = BTreeMap::new();
    for allow in allows {
        by_identity.entry(allow.identity).or_default().push(allow);
    }
    let mut peers = BTreeMap::new();
    for (identity, allows) in by_identity {
        let ports = PortSet::union(allows.iter().map(|a| &a.ports));
        if let PortSet::Ranges(r) = &ports
            && r.len() > MAX_PORT_RANGES
        {
            let mut policies: Vec<String> = allows.iter().map(|a| a.policy.to_string()).collect();
            policies.sort();
            policies.dedup();
            return Err(Overflow {
                peer: format!("the pods of identity {identity}"),
                ranges: r.len(),
                policies,
            });
        }
        if !ports.is_none() {
            peers.insert(identity, ports);
        }
    }
    Ok(peers)
}

/// An entry would need more port ranges than a map value holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflow {
    /// The CIDR, or the identity, whose entry it is.
    pub peer: String,
    pub ranges: usize,
    /// The policies whose rules meet in the entry, sorted.
    pub policies: Vec<String>,
}

/// The table for `allows`. Entries that would say the same as the entry
/// their addresses fall back to are left out, so a table holds only the
/// prefixes that matter. Fails on the first entry (in table order) with
/// more than [`MAX_PORT_RANGES`] ranges after merging.
pub fn flatten(allows: &[Allow<'_>]) -> Result<Table, Overflow> {
    let mut by_cidr: BTreeMap<IpNetwork, Vec<&Allow<'_>>> = BTreeMap::new();
    let mut candidates = BTreeSet::new();
    for allow in allows {
        let cidr = normalized(allow.cidr);
        by_cidr.entry(cidr).or_default().push(allow);
        candidates.insert(cidr);
        candidates.extend(allow.except.iter().copied().map(normalized));
    }

    let mut entries: Vec<Entry> = Vec::new();
    // Indices of the kept entries containing the current candidate,
    // outermost first: in sorted order a prefix comes right before the
    // prefixes inside it, so one that does not contain a candidate contains
    // none of the later ones either.
    let mut enclosing: Vec<usize> = Vec::new();
    let deny = PortSet::none();
    for candidate in candidates {
        let mut ports = Vec::new();
        let mut policies = BTreeSet::new();
        for outer in supernets(candidate) {
            for allow in by_cidr.get(&outer).into_iter().flatten() {
                if !allow.except.iter().any(|e| contains(e, &candidate)) {
                    ports.push(&allow.ports);
                    policies.insert(allow.policy);
                }
            }
        }
        let value = PortSet::union(ports);
        if let PortSet::Ranges(r) = &value
            && r.len() > MAX_PORT_RANGES
        {
            return Err(Overflow {
                peer: candidate.to_string(),
                ranges: r.len(),
                policies: policies.into_iter().map(String::from).collect(),
            });
        }
        while enclosing
            .last()
            .is_some_and(|&i| !contains(&entries[i].cidr, &candidate))
        {
            enclosing.pop();
        }
        let fallback = enclosing.last().map_or(&deny, |&i| &entries[i].ports);
        if value != *fallback {
            entries.push(Entry {
                cidr: candidate,
                ports: value,
            });
            enclosing.push(entries.len() - 1);
        }
    }
    Ok(Table {
        entries,
        peers: BTreeMap::new(),
    })
}

/// Whether `outer` contains every address of `inner`.
fn contains(outer: &IpNetwork, inner: &IpNetwork) -> bool {
    outer.prefix() <= inner.prefix() && outer.contains(inner.network())
}

/// `cidr` and every shorter prefix of its address, down to /0.
fn supernets(cidr: IpNetwork) -> impl Iterator<Item = IpNetwork> {
    (0..=cidr.prefix())
        .filter_map(move |len| IpNetwork::new(cidr.network(), len).ok().map(normalized))
}

fn normalized(cidr: IpNetwork) -> IpNetwork {
    flatnet_datapath::util::normalized(cidr)
}

/// `0.0.0.0/0` and `::/0`: every address.
pub fn everywhere() -> impl Iterator<Item = IpNetwork> {
    [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ]
    .into_iter()
    .filter_map(|a| IpNetwork::new(a, 0).ok())
}

#[cfg(test)]
mod tests {
    use super::super::ports::PortRange;
    use super::*;
    use crate::policy::tests::rng::Rng;
    use crate::protocol::Protocol;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn tcp(first: u16, last: u16) -> PortSet {
        PortSet::of([PortRange::new(Protocol::Tcp, first, last)])
    }

    fn allow(cidr: &str, except: &[&str], ports: PortSet) -> Allow<'static> {
        Allow {
            cidr: net(cidr),
            except: except.iter().map(|e| net(e)).collect(),
            ports,
            policy: "p",
        }
    }

    /// The union of the ports of every allow that matches `addr`, straight
    /// from the definition.
    fn brute_force(allows: &[Allow<'_>], addr: IpAddr) -> PortSet {
        let matching: Vec<&PortSet> = allows
            .iter()
            .filter(|a| a.cidr.contains(addr) && !a.except.iter().any(|e| e.contains(addr)))
            .map(|a| &a.ports)
            .collect();
        PortSet::union(matching)
    }

    fn assert_same_as_brute_force(allows: &[Allow<'_>], table: &Table, addrs: &[IpAddr]) {
        for &addr in addrs {
            let expected = brute_force(allows, addr);
            let got = table.lookup(addr).cloned().unwrap_or_else(PortSet::none);
            assert_eq!(got, expected, "{addr} in {allows:#?}\n=> {table:#?}");
            if !allows.iter().any(|a| a.cidr.contains(addr)) {
                assert_eq!(table.lookup(addr), None, "{addr} matches no rule");
            }
        }
    }

    /// Each CIDR's first and last address and their neighbours.
    fn edges(allows: &[Allow<'_>]) -> Vec<IpAddr> {
        let mut addrs = Vec::new();
        for cidr in allows.iter().flat_map(|a| a.except.iter().chain([&a.cidr])) {
            for addr in [cidr.network(), cidr.broadcast()] {
                addrs.push(addr);
                match addr {
                    IpAddr::V4(a) => {
                        let n = u32::from(a);
                        addrs.extend(
                            [n.wrapping_sub(1), n.wrapping_add(1)].map(|n| IpAddr::V4(n.into())),
                        );
                    }
                    IpAddr::V6(a) => {
                        let n = u128::from(a);
                        addrs.extend(
                            [n.wrapping_sub(1), n.wrapping_add(1)].map(|n| IpAddr::V6(n.into())),
                        );
                    }
                }
            }
        }
        addrs
    }

    #[test]
    fn an_except_shadows_its_block_and_a_narrower_rule_adds_to_it() {
        let allows = [
            allow("10.0.0.0/16", &["10.0.1.0/24"], tcp(80, 80)),
            allow("10.0.1.5/32", &[], tcp(443, 443)),
            allow(
                "10.0.0.0/8",
                &[],
                PortSet::of([PortRange::new(Protocol::Udp, 53, 53)]),
            ),
        ];
        let table = flatten(&allows).unwrap();
        let udp53 = PortSet::of([PortRange::new(Protocol::Udp, 53, 53)]);
        let lookup = |a: &str| table.lookup(a.parse().unwrap()).cloned();
        assert_eq!(
            lookup("10.0.2.1"),
            Some(PortSet::union([&tcp(80, 80), &udp53]))
        );
        assert_eq!(lookup("10.0.1.4"), Some(udp53.clone()), "inside the except");
        assert_eq!(
            lookup("10.0.1.5"),
            Some(PortSet::union([&tcp(443, 443), &udp53]))
        );
        assert_eq!(lookup("10.9.0.1"), Some(udp53));
        assert_eq!(lookup("11.0.0.1"), None);
        assert_eq!(lookup("fd00::1"), None);
        assert_same_as_brute_force(&allows, &table, &edges(&allows));
    }

    #[test]
    fn an_except_alone_becomes_a_deny_entry_and_redundant_entries_are_left_out() {
        let allows = [
            allow("10.0.0.0/16", &["10.0.1.0/24"], PortSet::Any),
            // Says nothing new: inside a block that already allows Any.
            allow("10.0.3.7/32", &[], tcp(80, 80)),
            allow("fd00::/64", &["fd00::/120"], PortSet::Any),
        ];
        let table = flatten(&allows).unwrap();
        assert_eq!(
            table.entries,
            [
                Entry {
                    cidr: net("10.0.0.0/16"),
                    ports: PortSet::Any
                },
                Entry {
                    cidr: net("10.0.1.0/24"),
                    ports: PortSet::none()
                },
                Entry {
                    cidr: net("fd00::/64"),
                    ports: PortSet::Any
                },
                Entry {
                    cidr: net("fd00::/120"),
                    ports: PortSet::none()
                },
            ]
        );
    }

    #[test]
    fn host_bits_are_cleared_and_an_empty_input_denies_everything() {
        let table = flatten(&[allow("10.1.2.3/16", &["10.1.9.9/24"], tcp(1, 2))]).unwrap();
        let cidrs: Vec<String> = table.entries.iter().map(|e| e.cidr.to_string()).collect();
        assert_eq!(cidrs, ["10.1.0.0/16", "10.1.9.0/24"]);
        assert_eq!(flatten(&[]).unwrap(), Table::default());
    }

    #[test]
    fn too_many_ranges_in_one_entry_name_the_entry_and_policies() {
        let many = |policy, base: u16| Allow {
            policy,
            ..allow(
                "10.0.0.0/24",
                &[],
                PortSet::of(
                    (0..9).map(|i| PortRange::new(Protocol::Tcp, base + 2 * i, base + 2 * i)),
                ),
            )
        };
        // 9 + 9 ranges that do not touch, and the /8's: 19 after merging.
        let err = flatten(&[
            many("b", 1000),
            many("a", 2000),
            allow("10.0.0.0/8", &[], tcp(1, 1)),
        ])
        .unwrap_err();
        assert_eq!(err.peer, "10.0.0.0/24");
        assert_eq!(err.ranges, 19);
        assert_eq!(err.policies, ["a", "b", "p"]);
        // Ranges that merge fit.
        assert!(flatten(&[many("a", 1000), many("b", 1001)]).is_ok());
    }

    /// A random prefix in a small corner of each family, so rules overlap.
    fn random_cidr(rng: &mut Rng, v6: bool) -> IpNetwork {
        if v6 {
            let addr = 0xfd00u128 << 112 | (rng.below(4) as u128) << 8 | rng.below(256) as u128;
            let prefix = rng.pick(&[0, 16, 64, 112, 118, 120, 124, 126, 128]);
            normalized(IpNetwork::new(IpAddr::V6(addr.into()), prefix).unwrap())
        } else {
            let addr = 0x0a00_0000u32 | (rng.below(4) as u32) << 8 | rng.below(256) as u32;
            let prefix = rng.pick(&[0, 8, 16, 22, 23, 24, 26, 28, 30, 31, 32]);
            normalized(IpNetwork::new(IpAddr::V4(addr.into()), prefix).unwrap())
        }
    }

    fn random_ports(rng: &mut Rng) -> PortSet {
        match rng.below(8) {
            0 => PortSet::Any,
            1 => PortSet::none(),
            _ => PortSet::of((0..1 + rng.below(3)).map(|_| {
                let protocol = rng.pick(&[Protocol::Tcp, Protocol::Udp, Protocol::Sctp]);
                let first = 78 + rng.below(6) as u16;
                PortRange::new(protocol, first, first + rng.below(3) as u16)
            })),
        }
    }

    #[test]
    fn lookup_equals_brute_force_on_random_rule_sets() {
        let mut rng = Rng(0x5eed_f1a7_0000_0001);
        for _ in 0..400 {
            let mut allows = Vec::new();
            for _ in 0..1 + rng.below(8) {
                let v6 = rng.below(3) == 0;
                let cidr = random_cidr(&mut rng, v6);
                let mut except = Vec::new();
                for _ in 0..rng.below(3) {
                    // Mostly inside the block, as the API requires; now and
                    // then anywhere, which must not matter.
                    let e = random_cidr(&mut rng, v6);
                    if rng.below(4) == 0 || contains(&cidr, &e) {
                        except.push(e);
                    }
                }
                allows.push(Allow {
                    cidr,
                    except,
                    ports: random_ports(&mut rng),
                    policy: "p",
                });
            }
            let table = flatten(&allows).unwrap();
            let mut addrs = edges(&allows);
            for _ in 0..64 {
                addrs.push(random_cidr(&mut rng, false).network());
                addrs.push(random_cidr(&mut rng, true).network());
                addrs.push(IpAddr::V4(
                    (0x0a00_0000u32 | rng.below(1 << 11) as u32).into(),
                ));
            }
            addrs.extend(
                ["192.168.1.1", "11.0.0.0", "9.255.255.255", "fe80::1", "::"]
                    .map(|a| a.parse::<IpAddr>().unwrap()),
            );
            assert_same_as_brute_force(&allows, &table, &addrs);
        }
    }
}

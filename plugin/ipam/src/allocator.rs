//! Which address to hand out next: pure logic over a validated address plan,
//! no I/O. Addresses are handled as `u128` so IPv4 and IPv6 share one walk.
//!
//! The walk is host-local's: start just after the last address reserved in
//! the range set, go through its ranges in order, wrap around, and stop when
//! back at the start; the gateways, the network and (IPv4) broadcast
//! addresses, excluded addresses and taken ones are skipped. Excluded CIDRs
//! are jumped over whole, so a huge IPv6 exclusion costs one step.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

/// An address as a number; the family travels separately.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inverse of [`to_u128`]; IPv4 values are always below 2^32 here.
pub fn from_u128(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(n))
    } else {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    }
}

/// One range: addresses `start..=end` of `subnet`, with its gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNetwork,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    pub fn is_ipv6(&self) -> bool {
        self.subnet.is_ipv6()
    }

    fn bounds(&self) -> (u128, u128) {
        (to_u128(self.start), to_u128(self.end))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv6() == self.is_ipv6() && {
            let (start, end) = self.bounds();
            (start..=end).contains(&to_u128(ip))
        }
    }

    /// Addresses of the subnet that are never handed out: its network
    /// address and, for IPv4, its broadcast address.
    fn subnet_specials(&self) -> [Option<u128>; 2] {
        let network = to_u128(self.subnet.network());
        let broadcast = (!self.is_ipv6()).then(|| to_u128(self.subnet.broadcast()));
        [Some(network), broadcast]
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}-{})", self.subnet, self.start, self.end)
    }
}

/// Ranges of one address family that together give one address per attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
}

impl RangeSet {
    pub fn is_ipv6(&self) -> bool {
        self.ranges.first().is_some_and(Range::is_ipv6)
    }

    /// The range holding `ip` between its start and end.
    pub fn range_of(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|range| range.contains(ip))
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges: Vec<String> = self.ranges.iter().map(ToString::to_string).collect();
        f.write_str(&ranges.join(", "))
    }
}

/// Addresses never handed out, as merged closed intervals per family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exclusions {
    v4: Vec<(u128, u128)>,
    v6: Vec<(u128, u128)>,
}

impl Exclusions {
    pub fn new(networks: &[IpNetwork]) -> Self {
        let mut out = Exclusions::default();
        for net in networks {
            let interval = (to_u128(net.network()), to_u128(net.broadcast()));
            match net {
                IpNetwork::V4(_) => out.v4.push(interval),
                IpNetwork::V6(_) => out.v6.push(interval),
            }
        }
        for list in [&mut out.v4, &mut out.v6] {
            list.sort_unstable();
            let mut merged: Vec<(u128, u128)> = Vec::with_capacity(list.len());
            for &(lo, hi) in list.iter() {
                match merged.last_mut() {
                    Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                    _ => merged.push((lo, hi)),
                }
            }
            *list = merged;
        }
        out
    }

    fn family(&self, v6: bool) -> &[(u128, u128)] {
        if v6 { &self.v6 } else { &self.v4 }
    }

    /// The end of the excluded interval holding `n`, if any.
    fn covering(&self, v6: bool, n: u128) -> Option<u128> {
        let list = self.family(v6);
        let index = list.partition_point(|&(lo, _)| lo <= n);
        index
            .checked_sub(1)
            .map(|i| list[i])
            .filter(|&(_, hi)| n <= hi)
            .map(|(_, hi)| hi)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.covering(ip.is_ipv6(), to_u128(ip)).is_some()
    }

    /// How many addresses of `lo..=hi` are excluded.
    fn count_in(&self, v6: bool, lo: u128, hi: u128) -> u128 {
        self.family(v6)
            .iter()
            .filter(|&&(a, b)| a <= hi && lo <= b)
            .map(|&(a, b)| (b.min(hi) - a.max(lo)).saturating_add(1))
            .fold(0u128, u128::saturating_add)
    }
}

/// Why a requested address cannot be handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    OutsideRanges,
    Gateway,
    NetworkAddress,
    Broadcast,
    Excluded,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::OutsideRanges => "is not inside any configured range",
            Refusal::Gateway => "is a gateway address",
            Refusal::NetworkAddress => "is the network address of its subnet",
            Refusal::Broadcast => "is the broadcast address of its subnet",
            Refusal::Excluded => "is excluded by \"ipam.exclude\"",
        })
    }
}

/// Everything the allocator needs: the range sets, the exclusions and the
/// addresses that are never handed out (gateways of every range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub sets: Vec<RangeSet>,
    pub exclude: Exclusions,
    gateways: BTreeSet<IpAddr>,
}

impl Plan {
    pub fn new(sets: Vec<RangeSet>, exclude: Exclusions) -> Self {
        let gateways = sets
            .iter()
            .flat_map(|set| set.ranges.iter().map(|range| range.gateway))
            .collect();
        Plan {
            sets,
            exclude,
            gateways,
        }
    }

    /// Never handed out whatever the store says: gateways, network and
    /// broadcast addresses of `range`, excluded addresses.
    fn refusal_in(&self, range: &Range, ip: IpAddr) -> Option<Refusal> {
        let n = to_u128(ip);
        let [network, broadcast] = range.subnet_specials();
        if self.gateways.contains(&ip) {
            Some(Refusal::Gateway)
        } else if network == Some(n) {
            Some(Refusal::NetworkAddress)
        } else if broadcast == Some(n) {
            Some(Refusal::Broadcast)
        } else if self.exclude.contains(ip) {
            Some(Refusal::Excluded)
        } else {
            None
        }
    }

    /// The range set a requested address belongs to, or why it cannot be had.
    pub fn locate(&self, ip: IpAddr) -> Result<usize, Refusal> {
        for (index, set) in self.sets.iter().enumerate() {
            if let Some(range) = set.range_of(ip) {
                return match self.refusal_in(range, ip) {
                    Some(refusal) => Err(refusal),
                    None => Ok(index),
                };
            }
        }
        // Outside every range: say so precisely when it is special in a subnet.
        let special = self
            .sets
            .iter()
            .flat_map(|set| &set.ranges)
            .filter(|range| range.subnet.contains(ip))
            .find_map(|range| self.refusal_in(range, ip));
        Err(special.unwrap_or(Refusal::OutsideRanges))
    }

    /// Whether `ip` may be held in range set `set` (inside it and not special).
    pub fn allocatable_in(&self, set: usize, ip: IpAddr) -> bool {
        self.sets
            .get(set)
            .and_then(|s| s.range_of(ip))
            .is_some_and(|range| self.refusal_in(range, ip).is_none())
    }

    /// The range of set `set` holding `ip`.
    pub fn range_of(&self, set: usize, ip: IpAddr) -> Option<&Range> {
        self.sets.get(set).and_then(|s| s.range_of(ip))
    }

    /// How many addresses range set `set` can hand out in all.
    pub fn capacity(&self, set: usize) -> u128 {
        let Some(set) = self.sets.get(set) else {
            return 0;
        };
        let v6 = set.is_ipv6();
        set.ranges
            .iter()
            .map(|range| {
                let (start, end) = range.bounds();
                let mut specials: BTreeSet<u128> =
                    range.subnet_specials().into_iter().flatten().collect();
                specials.extend(self.gateways.iter().map(|gw| to_u128(*gw)));
                let special = specials
                    .into_iter()
                    .filter(|n| (start..=end).contains(n))
                    .filter(|n| self.exclude.covering(v6, *n).is_none())
                    .count() as u128;
                (end - start)
                    .saturating_add(1)
                    .saturating_sub(self.exclude.count_in(v6, start, end))
                    .saturating_sub(special)
            })
            .fold(0u128, u128::saturating_add)
    }

    /// The next free address of range set `set`, walking from just after
    /// `last` (the last one reserved there) and wrapping around once.
    pub fn next_free(
        &self,
        set: usize,
        last: Option<IpAddr>,
        is_taken: impl Fn(IpAddr) -> bool,
    ) -> Option<IpAddr> {
        let ranges = &self.sets.get(set)?.ranges;
        let v6 = ranges.first()?.is_ipv6();
        let total = ranges
            .iter()
            .map(|r| {
                let (start, end) = r.bounds();
                (end - start).saturating_add(1)
            })
            .fold(0u128, u128::saturating_add);
        // Position: (range index, address); start after `last` when it is ours.
        let located = last.and_then(|ip| {
            ranges
                .iter()
                .position(|r| r.contains(ip))
                .map(|i| (i, to_u128(ip)))
        });
        let step = |(i, n): (usize, u128)| -> (usize, u128) {
            if n >= ranges[i].bounds().1 {
                let next = (i + 1) % ranges.len();
                (next, ranges[next].bounds().0)
            } else {
                (i, n + 1)
            }
        };
        let mut pos = match located {
            Some(at) => step(at),
            None => (0, ranges[0].bounds().0),
        };
        let mut walked: u128 = 0;
        while walked < total {
            let (i, n) = pos;
            let end = ranges[i].bounds().1;
            if let Some(hi) = self.exclude.covering(v6, n) {
                // Jump over the whole excluded interval (within this range).
                let to = hi.min(end);
                walked = walked.saturating_add(to - n + 1);
                pos = step((i, to));
                continue;
            }
            let ip = from_u128(v6, n);
            if self.refusal_in(&ranges[i], ip).is_none() && !is_taken(ip) {
                return Some(ip);
            }
            walked += 1;
            pos = step(pos);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn range(subnet: &str, start: &str, end: &str, gateway: &str) -> Range {
        Range {
            subnet: subnet.parse().unwrap(),
            start: ip(start),
            end: ip(end),
            gateway: ip(gateway),
        }
    }

    fn plan(sets: Vec<Vec<Range>>, exclude: &[&str]) -> Plan {
        let exclude: Vec<IpNetwork> = exclude.iter().map(|e| e.parse().unwrap()).collect();
        Plan::new(
            sets.into_iter().map(|ranges| RangeSet { ranges }).collect(),
            Exclusions::new(&exclude),
        )
    }

    /// Allocates until the pool is empty, like a store would.
    fn drain(plan: &Plan, set: usize, mut last: Option<IpAddr>) -> Vec<IpAddr> {
        let mut taken = HashSet::new();
        let mut order = Vec::new();
        while let Some(next) = plan.next_free(set, last, |a| taken.contains(&a)) {
            assert!(taken.insert(next), "{next} handed out twice");
            order.push(next);
            last = Some(next);
        }
        order
    }

    fn v4_24() -> Plan {
        plan(
            vec![vec![range(
                "10.0.0.0/24",
                "10.0.0.1",
                "10.0.0.254",
                "10.0.0.1",
            )]],
            &[],
        )
    }

    #[test]
    fn a_fresh_pool_starts_after_the_gateway() {
        let p = v4_24();
        assert_eq!(p.next_free(0, None, |_| false), Some(ip("10.0.0.2")));
    }

    #[test]
    fn the_walk_continues_after_the_last_reserved_address() {
        let p = v4_24();
        assert_eq!(
            p.next_free(0, Some(ip("10.0.0.7")), |_| false),
            Some(ip("10.0.0.8"))
        );
        // Released 10.0.0.3 is not reused at once.
        let taken: HashSet<IpAddr> = [ip("10.0.0.2"), ip("10.0.0.4")].into();
        assert_eq!(
            p.next_free(0, Some(ip("10.0.0.4")), |a| taken.contains(&a)),
            Some(ip("10.0.0.5"))
        );
    }

    #[test]
    fn the_walk_wraps_around_and_skips_gateway_and_broadcast() {
        let p = v4_24();
        assert_eq!(
            p.next_free(0, Some(ip("10.0.0.254")), |_| false),
            Some(ip("10.0.0.2"))
        );
        let taken: HashSet<IpAddr> = [ip("10.0.0.2")].into();
        assert_eq!(
            p.next_free(0, Some(ip("10.0.0.253")), |a| taken.contains(&a)),
            Some(ip("10.0.0.254"))
        );
        assert_eq!(
            p.next_free(0, Some(ip("10.0.0.254")), |a| taken.contains(&a)),
            Some(ip("10.0.0.3"))
        );
    }

    #[test]
    fn a_full_walk_hands_out_every_address_exactly_once() {
        let p = v4_24();
        let order = drain(&p, 0, Some(ip("10.0.0.100")));
        assert_eq!(order.len(), 253);
        assert_eq!(p.capacity(0), 253);
        assert_eq!(order[0], ip("10.0.0.101"));
        assert_eq!(order[153], ip("10.0.0.254"));
        assert_eq!(order[154], ip("10.0.0.2"), "wrapped past the gateway");
        for never in ["10.0.0.0", "10.0.0.1", "10.0.0.255"] {
            assert!(!order.contains(&ip(never)), "{never}");
        }
    }

    #[test]
    fn a_last_address_outside_the_set_starts_at_the_beginning() {
        let p = v4_24();
        assert_eq!(
            p.next_free(0, Some(ip("192.168.1.1")), |_| false),
            Some(ip("10.0.0.2"))
        );
        assert_eq!(
            p.next_free(0, Some(ip("fd00::1")), |_| false),
            Some(ip("10.0.0.2"))
        );
    }

    #[test]
    fn range_start_and_end_bound_the_walk() {
        let p = plan(
            vec![vec![range(
                "10.0.0.0/24",
                "10.0.0.10",
                "10.0.0.12",
                "10.0.0.1",
            )]],
            &[],
        );
        assert_eq!(
            drain(&p, 0, None),
            vec![ip("10.0.0.10"), ip("10.0.0.11"), ip("10.0.0.12")]
        );
        assert_eq!(p.capacity(0), 3);
    }

    #[test]
    fn several_ranges_are_walked_in_order_and_wrap() {
        let p = plan(
            vec![vec![
                range("10.0.0.0/24", "10.0.0.2", "10.0.0.3", "10.0.0.1"),
                range("10.9.0.0/24", "10.9.0.250", "10.9.0.255", "10.9.0.1"),
            ]],
            &[],
        );
        // .255 of the second range is its broadcast address.
        assert_eq!(
            drain(&p, 0, Some(ip("10.9.0.251"))),
            vec![
                ip("10.9.0.252"),
                ip("10.9.0.253"),
                ip("10.9.0.254"),
                ip("10.0.0.2"),
                ip("10.0.0.3"),
                ip("10.9.0.250"),
                ip("10.9.0.251")
            ]
        );
        assert_eq!(p.capacity(0), 7);
    }

    #[test]
    fn exclusions_are_never_handed_out() {
        let p = plan(
            vec![vec![range(
                "10.0.0.0/28",
                "10.0.0.1",
                "10.0.0.14",
                "10.0.0.1",
            )]],
            &[
                "10.0.0.4/30",
                "10.0.0.9/32",
                "10.0.0.10/32",
                "192.168.0.0/16",
            ],
        );
        let order = drain(&p, 0, None);
        let expect: Vec<IpAddr> = ["2", "3", "8", "11", "12", "13", "14"]
            .iter()
            .map(|h| ip(&format!("10.0.0.{h}")))
            .collect();
        assert_eq!(order, expect);
        assert_eq!(p.capacity(0), 7);
        assert_eq!(p.locate(ip("10.0.0.5")), Err(Refusal::Excluded));
    }

    #[test]
    fn excluding_a_whole_range_leaves_nothing() {
        let p = plan(
            vec![vec![range(
                "10.0.0.0/24",
                "10.0.0.1",
                "10.0.0.254",
                "10.0.0.1",
            )]],
            &["10.0.0.0/24"],
        );
        assert_eq!(p.next_free(0, None, |_| false), None);
        assert_eq!(p.capacity(0), 0);
    }

    #[test]
    fn ipv6_walks_and_hands_out_the_last_address() {
        let p = plan(
            vec![vec![range("fd00::/126", "fd00::1", "fd00::3", "fd00::1")]],
            &[],
        );
        // No broadcast in IPv6; the network address (subnet-router anycast) is skipped.
        assert_eq!(drain(&p, 0, None), vec![ip("fd00::2"), ip("fd00::3")]);
        assert_eq!(p.capacity(0), 2);
    }

    #[test]
    fn a_huge_ipv6_exclusion_is_jumped_not_walked() {
        let p = plan(
            vec![vec![range(
                "fd00::/64",
                "fd00::1",
                "fd00::ffff:ffff:ffff:ffff",
                "fd00::1",
            )]],
            &["fd00::/65"],
        );
        assert_eq!(
            p.next_free(0, None, |_| false),
            Some(ip("fd00::8000:0:0:0"))
        );
        assert_eq!(p.capacity(0), 1u128 << 63);
        // Walking from the very end wraps and jumps the exclusion again.
        assert_eq!(
            p.next_free(0, Some(ip("fd00::ffff:ffff:ffff:ffff")), |_| false),
            Some(ip("fd00::8000:0:0:0"))
        );
    }

    #[test]
    fn dual_stack_sets_walk_independently() {
        let p = plan(
            vec![
                vec![range("10.0.0.0/24", "10.0.0.1", "10.0.0.254", "10.0.0.1")],
                vec![range("fd00::/120", "fd00::1", "fd00::ff", "fd00::1")],
            ],
            &[],
        );
        assert_eq!(p.next_free(0, None, |_| false), Some(ip("10.0.0.2")));
        assert_eq!(p.next_free(1, None, |_| false), Some(ip("fd00::2")));
        // The IPv4 pointer means nothing to the IPv6 set.
        assert_eq!(
            p.next_free(1, Some(ip("10.0.0.9")), |_| false),
            Some(ip("fd00::2"))
        );
        assert_eq!(p.locate(ip("fd00::42")), Ok(1));
        assert_eq!(p.locate(ip("10.0.0.42")), Ok(0));
    }

    #[test]
    fn requested_addresses_are_checked() {
        let p = plan(
            vec![vec![range(
                "10.0.0.0/24",
                "10.0.0.10",
                "10.0.0.255",
                "10.0.0.20",
            )]],
            &["10.0.0.30"],
        );
        assert_eq!(p.locate(ip("10.0.0.11")), Ok(0));
        assert_eq!(p.locate(ip("10.0.0.20")), Err(Refusal::Gateway));
        assert_eq!(p.locate(ip("10.0.0.255")), Err(Refusal::Broadcast));
        assert_eq!(p.locate(ip("10.0.0.30")), Err(Refusal::Excluded));
        assert_eq!(p.locate(ip("10.0.0.5")), Err(Refusal::OutsideRanges));
        assert_eq!(p.locate(ip("10.1.0.11")), Err(Refusal::OutsideRanges));
        assert_eq!(p.locate(ip("fd00::1")), Err(Refusal::OutsideRanges));
        assert!(p.allocatable_in(0, ip("10.0.0.11")));
        assert!(!p.allocatable_in(0, ip("10.0.0.20")));
        assert!(!p.allocatable_in(1, ip("10.0.0.11")));
        // Network address when the range starts at it.
        let p = plan(
            vec![vec![range(
                "10.0.0.0/30",
                "10.0.0.0",
                "10.0.0.3",
                "10.0.0.1",
            )]],
            &[],
        );
        assert_eq!(p.locate(ip("10.0.0.0")), Err(Refusal::NetworkAddress));
        assert_eq!(drain(&p, 0, None), vec![ip("10.0.0.2")]);
        assert_eq!(p.capacity(0), 1);
    }

    #[test]
    fn a_gateway_of_another_range_is_never_handed_out() {
        let p = plan(
            vec![
                vec![range("10.0.0.0/24", "10.0.0.2", "10.0.0.5", "10.0.0.1")],
                vec![range("10.0.0.0/24", "10.0.0.6", "10.0.0.9", "10.0.0.3")],
            ],
            &[],
        );
        assert_eq!(
            drain(&p, 0, None),
            vec![ip("10.0.0.2"), ip("10.0.0.4"), ip("10.0.0.5")]
        );
        assert_eq!(p.capacity(0), 3);
    }

    #[test]
    fn taken_addresses_are_skipped_and_a_full_pool_says_so() {
        let p = v4_24();
        let all: HashSet<IpAddr> = drain(&p, 0, None).into_iter().collect();
        assert_eq!(p.next_free(0, None, |a| all.contains(&a)), None);
        let mut one_free = all.clone();
        one_free.remove(&ip("10.0.0.77"));
        assert_eq!(
            p.next_free(0, Some(ip("10.0.0.200")), |a| one_free.contains(&a)),
            Some(ip("10.0.0.77"))
        );
    }

    #[test]
    fn exclusions_merge_and_count() {
        let e = Exclusions::new(&[
            "10.0.0.8/29".parse().unwrap(),
            "10.0.0.0/29".parse().unwrap(),
            "10.0.0.12/32".parse().unwrap(),
            "10.0.1.0/24".parse().unwrap(),
        ]);
        assert_eq!(
            e.v4,
            vec![
                (to_u128(ip("10.0.0.0")), to_u128(ip("10.0.0.15"))),
                (to_u128(ip("10.0.1.0")), to_u128(ip("10.0.1.255")))
            ]
        );
        assert!(e.contains(ip("10.0.0.15")));
        assert!(!e.contains(ip("10.0.0.16")));
        assert!(!e.contains(ip("::a00:f")), "families stay apart");
        assert_eq!(
            e.count_in(false, to_u128(ip("10.0.0.10")), to_u128(ip("10.0.1.1"))),
            8
        );
    }

    #[test]
    fn addresses_round_trip_through_numbers() {
        for s in [
            "0.0.0.0",
            "10.1.2.3",
            "255.255.255.255",
            "::",
            "fd00::1",
            "ffff::ffff",
        ] {
            let a = ip(s);
            assert_eq!(from_u128(a.is_ipv6(), to_u128(a)), a);
        }
    }
}

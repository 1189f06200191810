//! The pod CIDRs a plan has given a route (and the node's own), by address
//! range: whether a new CIDR overlaps one of them is a lookup, not a scan
//! of all claimed before it, so a plan over 5,000 nodes is not quadratic.
//! Two prefixes either nest or do not meet, so the ranges are kept
//! disjoint: a claim that covers earlier ones takes their place.

use std::collections::BTreeMap;

use ipnetwork::IpNetwork;

/// A CIDR's family (true: IPv6) and first and last address.
fn range(cidr: &IpNetwork) -> (bool, u128, u128) {
    match cidr {
        IpNetwork::V4(net) => (
            false,
            u128::from(u32::from(net.network())),
            u128::from(u32::from(net.broadcast())),
        ),
        IpNetwork::V6(net) => {
            let start = u128::from(net.network());
            let host_bits = 128 - u32::from(net.prefix());
            let hosts = 1u128.checked_shl(host_bits).map_or(u128::MAX, |n| n - 1);
            (true, start, start | hosts)
        }
    }
}

/// Claimed CIDRs by (family, first address): their last address, owner
/// and the CIDR itself.
#[derive(Debug, Default)]
pub struct Claimed {
    ranges: BTreeMap<(bool, u128), (u128, String, IpNetwork)>,
}

impl Claimed {
    /// A claimed CIDR that `cidr` overlaps, and its owner.
    pub fn overlapping(&self, cidr: &IpNetwork) -> Option<(&str, IpNetwork)> {
        let (v6, start, end) = range(cidr);
        // The ranges are disjoint and sorted: of those starting at or
        // before `cidr`'s end, the last reaches furthest.
        let ((family, _), (last, owner, other)) = self.ranges.range(..=(v6, end)).next_back()?;
        (*family == v6 && *last >= start).then_some((owner.as_str(), *other))
    }

    /// `owner` claims `cidr`; claimed CIDRs inside it give way to it, and
    /// one that holds it already covers it.
    pub fn claim(&mut self, owner: &str, cidr: IpNetwork) {
        let (v6, start, end) = range(&cidr);
        if let Some((_, other)) = self.overlapping(&cidr)
            && other.prefix() <= cidr.prefix()
        {
            return;
        }
        let inside: Vec<(bool, u128)> = self
            .ranges
            .range((v6, start)..=(v6, end))
            .map(|(key, _)| *key)
            .collect();
        for key in inside {
            self.ranges.remove(&key);
        }
        self.ranges
            .insert((v6, start), (end, owner.to_string(), cidr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> IpNetwork {
        text.parse().unwrap()
    }

    /// What the plan did before: a scan of every claimed CIDR.
    fn overlaps(a: &IpNetwork, b: &IpNetwork) -> bool {
        a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
    }

    #[test]
    fn a_lookup_finds_what_a_scan_of_every_claim_finds() {
        // A small generator of its own: the same CIDRs every run.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut random_cidr = || {
            let bits = next();
            if bits % 3 == 0 {
                let prefix = 96 + (bits >> 8) % 33;
                let address = 0xfd00_u128 << 112 | u128::from(next() % 4096) << 20;
                IpNetwork::new(std::net::Ipv6Addr::from(address).into(), prefix as u8)
            } else {
                let prefix = 8 + (bits >> 8) % 25;
                let address = 10 << 24 | (next() % 65536) << 8;
                IpNetwork::new(
                    std::net::Ipv4Addr::from(address as u32).into(),
                    prefix as u8,
                )
            }
            .map(|c| IpNetwork::new(c.network(), c.prefix()).unwrap())
            .unwrap()
        };
        let mut claimed = Claimed::default();
        let mut scanned: Vec<IpNetwork> = Vec::new();
        let (mut found, mut free) = (0, 0);
        for _ in 0..3000 {
            let wanted = random_cidr();
            let by_scan = scanned.iter().any(|c| overlaps(c, &wanted));
            let by_lookup = claimed.overlapping(&wanted);
            assert_eq!(by_lookup.is_some(), by_scan, "{wanted}: {by_lookup:?}");
            if let Some((_, other)) = by_lookup {
                assert!(overlaps(&other, &wanted), "{wanted} and {other}");
                found += 1;
            } else {
                claimed.claim("node", wanted);
                scanned.push(wanted);
                free += 1;
            }
        }
        assert!(
            found > 100 && free > 100,
            "{found} overlapping, {free} free"
        );
    }

    #[test]
    fn the_nodes_own_cidrs_may_nest_and_still_count() {
        let mut claimed = Claimed::default();
        claimed.claim("me", cidr("10.0.0.0/16"));
        claimed.claim("me", cidr("10.0.0.0/8"));
        claimed.claim("me", cidr("10.1.0.0/16"));
        let (owner, other) = claimed.overlapping(&cidr("10.5.0.0/24")).unwrap();
        assert_eq!((owner, other), ("me", cidr("10.0.0.0/8")));
        assert!(claimed.overlapping(&cidr("11.0.0.0/24")).is_none());
        assert!(claimed.overlapping(&cidr("fd00::/64")).is_none());
        claimed.claim("peer", cidr("fd00::/64"));
        assert!(claimed.overlapping(&cidr("fd00::1/128")).is_some());
        assert!(claimed.overlapping(&cidr("::/0")).is_some());
        assert!(claimed.overlapping(&cidr("0.0.0.0/0")).is_some());
    }
}

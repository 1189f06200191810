//! What a rule allows on top of addresses: protocols and port ranges, their
//! union, and the bounded, canonical form one BPF map value holds.

use std::fmt;

use crate::protocol::Protocol;

/// The most port ranges one table entry carries. A BPF map value has a
/// fixed size, and the datapath checks a packet against the ranges in a
/// loop the verifier must see bounded: 16 ranges of 6 bytes (protocol, first
/// and last port) plus a count keep the value near 100 bytes, so a pod's LPM
/// trie with thousands of peer entries stays small and the per-packet scan
/// short. Real policies name a handful of ports per peer, and ranges
/// (`endPort`) cover the rest.
pub const MAX_PORT_RANGES: usize = 16;

/// Ports `first..=last` of one protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub protocol: Protocol,
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn new(protocol: Protocol, first: u16, last: u16) -> Self {
        PortRange {
            protocol,
            first,
            last,
        }
    }

    /// Every port of `protocol`, 0 included: "all ports" must not leave
    /// out a packet the datapath could see.
    pub fn all(protocol: Protocol) -> Self {
        PortRange::new(protocol, 0, u16::MAX)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        };
        if self.first == self.last {
            write!(f, "{name}/{}", self.first)
        } else {
            write!(f, "{name}/{}-{}", self.first, self.last)
        }
    }
}

/// What traffic to an address is allowed: everything (all protocols,
/// ICMP included), or only these ranges. Ranges are kept sorted, with
/// overlapping and adjacent ranges of a protocol merged, so equal sets
/// compare equal. An empty list allows nothing: in a table it shadows a
/// shorter prefix (an ipBlock's `except`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortSet {
    Any,
    Ranges(Vec<PortRange>),
}

impl PortSet {
    /// The set allowing nothing.
    pub fn none() -> Self {
        PortSet::Ranges(Vec::new())
    }

    /// The set of `ranges`, in canonical form.
    pub fn of(ranges: impl IntoIterator<Item = PortRange>) -> Self {
        PortSet::Ranges(merge(ranges.into_iter().collect()))
    }

    /// The union of `sets`, in canonical form.
    pub fn union<'a>(sets: impl IntoIterator<Item = &'a PortSet>) -> Self {
        let mut ranges = Vec::new();
        for set in sets {
            match set {
                PortSet::Any => return PortSet::Any,
                PortSet::Ranges(r) => ranges.extend_from_slice(r),
            }
        }
        PortSet::of(ranges)
    }

    pub fn is_none(&self) -> bool {
        matches!(self, PortSet::Ranges(r) if r.is_empty())
    }

    /// Whether a packet of IP protocol `protocol` to `port` is allowed
    /// (`port` is ignored for protocols without ports when the set is Any).
    pub fn allows(&self, protocol: u8, port: u16) -> bool {
        match self {
            PortSet::Any => true,
            PortSet::Ranges(ranges) => ranges
                .iter()
                .any(|r| r.protocol.number() == protocol && (r.first..=r.last).contains(&port)),
        }
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSet::Any => f.write_str("any"),
            PortSet::Ranges(r) if r.is_empty() => f.write_str("none"),
            PortSet::Ranges(r) => {
                let parts: Vec<String> = r.iter().map(ToString::to_string).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

/// Sorts `ranges` and merges those of a protocol that overlap or touch.
fn merge(mut ranges: Vec<PortRange>) -> Vec<PortRange> {
    ranges.sort();
    let mut merged: Vec<PortRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last)
                if last.protocol == range.protocol
                    && u32::from(range.first) <= u32::from(last.last) + 1 =>
            {
                last.last = last.last.max(range.last);
            }
            _ => merged.push(range),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: Protocol = Protocol::Tcp;
    const UDP: Protocol = Protocol::Udp;

    fn r(protocol: Protocol, first: u16, last: u16) -> PortRange {
        PortRange::new(protocol, first, last)
    }

    #[test]
    fn overlapping_and_adjacent_ranges_of_a_protocol_merge() {
        let set = PortSet::of([
            r(TCP, 90, 100),
            r(TCP, 80, 80),
            r(UDP, 81, 81),
            r(TCP, 81, 85),
            r(TCP, 95, 120),
            r(TCP, 200, 200),
            r(UDP, 80, 80),
        ]);
        assert_eq!(
            set,
            PortSet::Ranges(vec![
                r(TCP, 80, 85),
                r(TCP, 90, 120),
                r(TCP, 200, 200),
                r(UDP, 80, 81)
            ])
        );
        assert_eq!(set.to_string(), "tcp/80-85,tcp/90-120,tcp/200,udp/80-81");
    }

    #[test]
    fn ranges_at_the_top_of_the_port_space_merge_without_overflow() {
        let set = PortSet::of([r(TCP, 65535, 65535), r(TCP, 0, 65535), r(TCP, 65534, 65535)]);
        assert_eq!(set, PortSet::Ranges(vec![PortRange::all(TCP)]));
    }

    #[test]
    fn a_union_with_any_is_any() {
        let some = PortSet::of([r(TCP, 80, 80)]);
        assert_eq!(PortSet::union([&some, &PortSet::Any]), PortSet::Any);
        assert_eq!(
            PortSet::union([&some, &PortSet::of([r(TCP, 81, 81)])]),
            PortSet::of([r(TCP, 80, 81)])
        );
        assert!(PortSet::union([]).is_none());
    }

    #[test]
    fn allows_checks_protocol_and_range() {
        let set = PortSet::of([r(TCP, 80, 90), r(UDP, 53, 53)]);
        assert!(set.allows(6, 80) && set.allows(6, 90) && set.allows(17, 53));
        assert!(!set.allows(6, 91) && !set.allows(17, 80) && !set.allows(132, 80));
        assert!(!set.allows(1, 0), "ICMP is not in a port list");
        assert!(PortSet::Any.allows(1, 0));
        assert!(!PortSet::none().allows(6, 80));
    }
}

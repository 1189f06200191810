//! One tier's rules for one pod, one direction and one kind of peer,
//! reduced to what the datapath can look up per packet: the port space
//! painted, rule by rule in the order they are judged, with the action of
//! the first rule that matches each port (and each protocol without
//! ports). What no rule paints falls to the next tier.
//!
//! A peer kind is what the rules can tell apart about the other end (a pod
//! identity, a node, a class of addresses): every rule either matches all
//! of its traffic's peers or none, so `peer_matches` is asked per rule, not
//! per packet. [`Painted::verdict`] is then one range search, and
//! [`decide`] puts the tiers together as [`super::judge`] does.

use super::cluster_network_policy::{Action, Peer, Ports, Rule};
use crate::policy::pod::Container;
use crate::protocol::Protocol;

/// The protocols rules name ports of.
pub const PORT_PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// Which rule decided: the policy's place in the tier's order and the
/// rule's in the policy (what a drop is reported with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleRef {
    pub policy: u16,
    pub rule: u16,
}

/// A rule's action, and the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    pub action: Action,
    pub rule: RuleRef,
}

/// Ports `first..=last` of `protocol`, and what the first rule matching
/// them does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PaintedRange {
    pub protocol: Protocol,
    pub first: u16,
    pub last: u16,
    pub verdict: Verdict,
}

/// A tier's rules for one peer kind: disjoint port ranges sorted by
/// protocol and port, and the verdict for every protocol without ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Painted {
    pub ranges: Vec<PaintedRange>,
    pub other: Option<Verdict>,
}

impl Painted {
    /// The verdict for `protocol` (its IP number) and destination `port`;
    /// None: no rule of the tier matches.
    pub fn verdict(&self, protocol: u8, port: u16) -> Option<Verdict> {
        if !PORT_PROTOCOLS.iter().any(|p| p.number() == protocol) {
            return self.other;
        }
        self.ranges
            .iter()
            .find(|r| r.protocol.number() == protocol && r.first <= port && port <= r.last)
            .map(|r| r.verdict)
    }

    /// Whether every port of every protocol is painted: later rules
    /// cannot change anything.
    fn complete(&self) -> bool {
        self.other.is_some()
            && PORT_PROTOCOLS.iter().all(|protocol| {
                let covered: u32 = self
                    .ranges
                    .iter()
                    .filter(|r| r.protocol == *protocol)
                    .map(|r| u32::from(r.last) - u32::from(r.first) + 1)
                    .sum();
                covered == 1 << 16
            })
    }

    /// Paints what is not painted yet of `first..=last` of `protocol`.
    fn fill(&mut self, protocol: Protocol, first: u16, last: u16, verdict: Verdict) {
        let mut taken: Vec<(u32, u32)> = self
            .ranges
            .iter()
            .filter(|r| r.protocol == protocol && r.last >= first && r.first <= last)
            .map(|r| (u32::from(r.first), u32::from(r.last)))
            .collect();
        taken.sort_unstable();
        let (mut next, end) = (u32::from(first), u32::from(last) + 1);
        // Past the last port: the gap after the last range taken.
        let beyond = 1 << 16;
        for (taken_first, taken_last) in taken.into_iter().chain([(beyond, beyond)]) {
            let gap_end = taken_first.min(end);
            if next < gap_end {
                self.ranges.push(PaintedRange {
                    protocol,
                    first: next as u16,
                    last: (gap_end - 1) as u16,
                    verdict,
                });
            }
            next = next.max(taken_last + 1);
            if next >= end {
                break;
            }
        }
    }

    /// Paints everything not painted yet.
    fn fill_all(&mut self, verdict: Verdict) {
        for protocol in PORT_PROTOCOLS {
            self.fill(protocol, 0, u16::MAX, verdict);
        }
        self.other.get_or_insert(verdict);
    }

    fn sort(&mut self) {
        self.ranges.sort_by_key(|r| (r.protocol.number(), r.first));
    }
}

/// A tier's rules for one direction, in the order they are judged.
pub type OrderedRules<'a> = [(RuleRef, &'a Rule)];

/// Paints `rules` for a peer kind: `peer_matches` says whether one of a
/// rule's peers matches it; `destination` is the destination pod's
/// containers when it is a pod (its named ports). A rule holding
/// something unsupported fails closed, as [`super::judge`] says.
pub fn paint(
    rules: &OrderedRules<'_>,
    peer_matches: impl Fn(&Peer) -> bool,
    destination: Option<&[Container]>,
) -> Painted {
    let mut painted = Painted::default();
    for (rule_ref, rule) in rules {
        if painted.complete() {
            break;
        }
        if rule.has_unsupported() {
            if rule.action != Action::Accept {
                let deny = Verdict {
                    action: Action::Deny,
                    rule: *rule_ref,
                };
                painted.fill_all(deny);
            }
            continue;
        }
        if !rule.peers.iter().any(&peer_matches) {
            continue;
        }
        let verdict = Verdict {
            action: rule.action,
            rule: *rule_ref,
        };
        if rule.protocols.is_empty() {
            painted.fill_all(verdict);
            continue;
        }
        for ports in rule.protocols.iter() {
            match ports {
                Ports::Range {
                    protocol,
                    first,
                    last,
                } => painted.fill(*protocol, *first, *last, verdict),
                Ports::Named(name) => {
                    for (protocol, port) in named(destination, name) {
                        painted.fill(protocol, port, port, verdict);
                    }
                }
                Ports::Unsupported(_) => {}
            }
        }
    }
    painted.sort();
    painted
}

/// The (protocol, port) of each of `destination`'s container ports named
/// `name`.
fn named(destination: Option<&[Container]>, name: &str) -> Vec<(Protocol, u16)> {
    destination
        .unwrap_or_default()
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|port| port.name.as_deref() == Some(name))
        .filter_map(|port| {
            let protocol = Protocol::from_kube(port.protocol.as_deref())?;
            Some((protocol, u16::try_from(port.container_port).ok()?))
        })
        .collect()
}

/// The verdict of the tiers as the datapath reaches it: the Admin tier's
/// painting, NetworkPolicy's verdict where it isolates the pod, the
/// Baseline tier's, then accept.
pub fn decide(
    admin: &Painted,
    network_policy: Option<bool>,
    baseline: &Painted,
    protocol: u8,
    port: u16,
) -> bool {
    match admin.verdict(protocol, port).map(|v| v.action) {
        Some(Action::Accept) => return true,
        Some(Action::Deny) => return false,
        Some(Action::Pass) | None => {}
    }
    if let Some(accepted) = network_policy {
        return accepted;
    }
    baseline
        .verdict(protocol, port)
        .is_none_or(|v| v.action != Action::Deny)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(action: Action, rule: u16) -> Verdict {
        Verdict {
            action,
            rule: RuleRef { policy: 0, rule },
        }
    }

    #[test]
    fn a_later_rule_paints_only_what_earlier_ones_left() {
        let mut painted = Painted::default();
        painted.fill(Protocol::Tcp, 80, 90, verdict(Action::Deny, 0));
        painted.fill(Protocol::Tcp, 85, 100, verdict(Action::Accept, 1));
        painted.fill(Protocol::Tcp, 0, u16::MAX, verdict(Action::Pass, 2));
        painted.sort();
        let tcp = |port| painted.verdict(6, port).map(|v| (v.action, v.rule.rule));
        assert_eq!(tcp(0), Some((Action::Pass, 2)));
        assert_eq!(tcp(79), Some((Action::Pass, 2)));
        assert_eq!(tcp(80), Some((Action::Deny, 0)));
        assert_eq!(tcp(90), Some((Action::Deny, 0)));
        assert_eq!(tcp(91), Some((Action::Accept, 1)));
        assert_eq!(tcp(100), Some((Action::Accept, 1)));
        assert_eq!(tcp(101), Some((Action::Pass, 2)));
        assert_eq!(tcp(u16::MAX), Some((Action::Pass, 2)));
        assert_eq!(painted.verdict(17, 80), None);
        assert_eq!(painted.verdict(1, 0), None);
        assert_eq!(painted.ranges.len(), 4);
    }

    #[test]
    fn everything_painted_is_complete_and_other_protocols_follow_portless_rules() {
        let mut painted = Painted::default();
        painted.fill(Protocol::Udp, 53, 53, verdict(Action::Accept, 0));
        assert!(!painted.complete());
        painted.fill_all(verdict(Action::Deny, 1));
        assert!(painted.complete());
        assert_eq!(painted.verdict(1, 0), Some(verdict(Action::Deny, 1)));
        assert_eq!(painted.verdict(17, 53), Some(verdict(Action::Accept, 0)));
        assert_eq!(painted.verdict(132, 9), Some(verdict(Action::Deny, 1)));
    }
}

//! The order in which the API judges one direction of a connection: the
//! Admin tier, then NetworkPolicy, then the Baseline tier, then the default
//! (accept). Within a tier, policies by priority (lower first; equal
//! priorities by name, where the API leaves the order to the
//! implementation), and within a policy its rules as written; the first
//! rule that matches decides: `Accept` and `Deny` for good, `Pass` hands
//! the connection to the next tier. NetworkPolicy decides for good for a
//! pod it isolates in that direction, and not at all for the others.
//!
//! This is the reference the datapath's tables are compared with: slow
//! (every rule, per connection) and plain.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use super::cluster_network_policy::{
    Action, ClusterNetworkPolicy, NamespacedPods, Peer, Ports, Rule, Subject, Tier,
};
use crate::policy::Direction;
use crate::policy::pod::Container;
use crate::policy::selector::matches;
use crate::protocol::Protocol;

/// A pod as the rules see it: its namespace's labels, its own, and its
/// containers (named ports).
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    pub namespace_labels: &'a BTreeMap<String, String>,
    pub labels: &'a BTreeMap<String, String>,
    pub containers: &'a [Container],
}

/// The far end of a connection: its address, the pod it belongs to (not a
/// host-network pod: those are no pod peers), the node it belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Remote<'a> {
    pub address: IpAddr,
    pub pod: Option<Workload<'a>>,
    pub node_labels: Option<&'a BTreeMap<String, String>>,
}

/// What is sent: the IP protocol number (ICMP too) and the destination
/// port (0 without ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
    pub protocol: u8,
    pub port: u16,
}

/// Accepted or denied, and by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub accepted: bool,
    pub by: DecidedBy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidedBy {
    /// A rule of a ClusterNetworkPolicy (its tier, name and rule index).
    Rule {
        tier: Tier,
        policy: String,
        rule: usize,
    },
    NetworkPolicy,
    /// No tier decided.
    Default,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.accepted { "accepted" } else { "denied" };
        match &self.by {
            DecidedBy::Rule { tier, policy, rule } => {
                write!(f, "{verdict} by {tier:?} policy {policy}, rule {rule}")
            }
            DecidedBy::NetworkPolicy => write!(f, "{verdict} by NetworkPolicy"),
            DecidedBy::Default => write!(f, "{verdict} by default"),
        }
    }
}

/// One direction of `subject`'s traffic with `remote`: for ingress
/// `remote` sends to `subject`, for egress `subject` sends to `remote`.
/// `network_policy` is NetworkPolicy's verdict when it isolates `subject`
/// in `direction` (None when no NetworkPolicy does).
pub fn judge(
    policies: &[ClusterNetworkPolicy],
    direction: Direction,
    subject: &Workload<'_>,
    remote: &Remote<'_>,
    traffic: Traffic,
    network_policy: Option<bool>,
) -> Decision {
    let tier = |tier| first_match(policies, tier, direction, subject, remote, traffic);
    match tier(Tier::Admin) {
        Some(decision) if decision.1 != Action::Pass => return decided(decision, Tier::Admin),
        _ => {}
    }
    if let Some(accepted) = network_policy {
        return Decision {
            accepted,
            by: DecidedBy::NetworkPolicy,
        };
    }
    match tier(Tier::Baseline) {
        Some(decision) if decision.1 != Action::Pass => decided(decision, Tier::Baseline),
        _ => Decision {
            accepted: true,
            by: DecidedBy::Default,
        },
    }
}

/// The policies of `tier` that select `subject`, in the order they are
/// judged.
pub fn in_order<'a>(
    policies: &'a [ClusterNetworkPolicy],
    tier: Tier,
    subject: &Workload<'_>,
) -> Vec<&'a ClusterNetworkPolicy> {
    let mut selecting: Vec<&ClusterNetworkPolicy> = policies
        .iter()
        .filter(|p| p.tier == tier && selects(&p.subject, subject))
        .collect();
    selecting.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
    selecting
}

/// Whether `subject` is one of the pods a policy applies to.
pub fn selects(subject: &Subject, pod: &Workload<'_>) -> bool {
    match subject {
        Subject::Namespaces(namespaces) => matches(namespaces, pod.namespace_labels),
        Subject::Pods(pods) => selects_pod(pods, pod),
        Subject::Unsupported => false,
    }
}

fn selects_pod(selector: &NamespacedPods, pod: &Workload<'_>) -> bool {
    matches(&selector.namespaces, pod.namespace_labels) && matches(&selector.pods, pod.labels)
}

/// (policy name, action, rule index) of the first rule of `tier` that
/// matches.
fn first_match(
    policies: &[ClusterNetworkPolicy],
    tier: Tier,
    direction: Direction,
    subject: &Workload<'_>,
    remote: &Remote<'_>,
    traffic: Traffic,
) -> Option<(String, Action, usize)> {
    for policy in in_order(policies, tier, subject) {
        let rules = match direction {
            Direction::Ingress => &policy.ingress,
            Direction::Egress => &policy.egress,
        };
        // The destination's containers name the named ports.
        let destination = match direction {
            Direction::Ingress => Some(subject),
            Direction::Egress => remote.pod.as_ref(),
        };
        for (index, rule) in rules.iter().enumerate() {
            if let Some(action) = rule_action(rule, remote, destination, traffic) {
                return Some((policy.name.to_string(), action, index));
            }
        }
    }
    None
}

/// What `rule` does to the traffic: None when it does not match. A rule
/// holding something unsupported fails closed: an `Accept` matches nothing,
/// a `Deny` or `Pass` denies everything.
fn rule_action(
    rule: &Rule,
    remote: &Remote<'_>,
    destination: Option<&Workload<'_>>,
    traffic: Traffic,
) -> Option<Action> {
    if rule.has_unsupported() {
        return (rule.action != Action::Accept).then_some(Action::Deny);
    }
    let peer_matches = rule.peers.iter().any(|peer| peer_has(peer, remote));
    let ports_match = rule.protocols.is_empty()
        || rule
            .protocols
            .iter()
            .any(|ports| ports_have(ports, destination, traffic));
    (peer_matches && ports_match).then_some(rule.action)
}

pub(super) fn peer_has(peer: &Peer, remote: &Remote<'_>) -> bool {
    match peer {
        Peer::Namespaces(namespaces) => remote
            .pod
            .is_some_and(|pod| matches(namespaces, pod.namespace_labels)),
        Peer::Pods(pods) => remote.pod.is_some_and(|pod| selects_pod(pods, &pod)),
        Peer::Nodes(nodes) => remote
            .node_labels
            .is_some_and(|labels| matches(nodes, labels)),
        Peer::Networks(networks) => networks.iter().any(|n| n.contains(remote.address)),
        Peer::Unsupported(_) => false,
    }
}

fn ports_have(ports: &Ports, destination: Option<&Workload<'_>>, traffic: Traffic) -> bool {
    match ports {
        Ports::Range {
            protocol,
            first,
            last,
        } => protocol.number() == traffic.protocol && (*first..=*last).contains(&traffic.port),
        Ports::Named(name) => destination.is_some_and(|pod| {
            pod.containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .any(|port| {
                    port.name.as_deref() == Some(&**name)
                        && Protocol::from_kube(port.protocol.as_deref())
                            .is_some_and(|p| p.number() == traffic.protocol)
                        && i32::from(traffic.port) == port.container_port
                })
        }),
        Ports::Unsupported(_) => false,
    }
}

fn decided((policy, action, rule): (String, Action, usize), tier: Tier) -> Decision {
    Decision {
        accepted: action == Action::Accept,
        by: DecidedBy::Rule { tier, policy, rule },
    }
}

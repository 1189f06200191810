//! The evaluation order against reachability tables, as the upstream
//! NetworkPolicy and network-policy-api tests write them: pods a, b, c in
//! namespaces x, y, z; every pair judged (the sender's egress and the
//! receiver's ingress), the table compared with the one expected.

mod matching;
mod paint;
mod precedence;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::policy::Direction;
use crate::policy::pod::{Container, ContainerPort};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const TCP: Traffic = Traffic {
    protocol: 6,
    port: 80,
};
const UDP: Traffic = Traffic {
    protocol: 17,
    port: 81,
};
const ICMP: Traffic = Traffic {
    protocol: 1,
    port: 0,
};

/// One pod of the universe, `x/a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PodId(usize, usize);

impl PodId {
    fn all() -> impl Iterator<Item = PodId> {
        (0..3).flat_map(|n| (0..3).map(move |p| PodId(n, p)))
    }
    fn namespace(self) -> &'static str {
        NAMESPACES[self.0]
    }
    fn name(self) -> String {
        format!("{}/{}", NAMESPACES[self.0], PODS[self.1])
    }
    fn address(self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, self.0 as u8, self.1 as u8 + 1))
    }
}

struct Universe {
    namespace_labels: Vec<BTreeMap<String, String>>,
    pod_labels: Vec<BTreeMap<String, String>>,
    containers: Vec<Container>,
}

fn labels(key: &str, value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(key.to_string(), value.to_string())])
}

impl Universe {
    fn new() -> Self {
        let port = |name: &str, port, protocol: &str| ContainerPort {
            name: Some(name.to_string()),
            container_port: port,
            protocol: Some(protocol.to_string()),
        };
        Universe {
            namespace_labels: NAMESPACES.iter().map(|n| labels("ns", n)).collect(),
            pod_labels: PODS.iter().map(|p| labels("pod", p)).collect(),
            containers: vec![Container {
                ports: Some(vec![
                    port("serve-80-tcp", 80, "TCP"),
                    port("serve-81-udp", 81, "UDP"),
                ]),
            }],
        }
    }

    fn workload(&self, pod: PodId) -> Workload<'_> {
        Workload {
            namespace_labels: &self.namespace_labels[pod.0],
            labels: &self.pod_labels[pod.1],
            containers: &self.containers,
        }
    }

    fn remote(&self, pod: PodId) -> Remote<'_> {
        Remote {
            address: pod.address(),
            pod: Some(self.workload(pod)),
            node_labels: None,
        }
    }
}

/// NetworkPolicy's verdict for (subject, direction, the other pod): None
/// where it does not isolate the subject in that direction.
type NetworkPolicies = dyn Fn(PodId, Direction, PodId) -> Option<bool>;

fn no_network_policy(_: PodId, _: Direction, _: PodId) -> Option<bool> {
    None
}

/// Whether each pod reaches each other pod (itself included).
fn table(
    policies: &[ClusterNetworkPolicy],
    network_policies: &NetworkPolicies,
    traffic: Traffic,
) -> BTreeMap<(PodId, PodId), bool> {
    let universe = Universe::new();
    // `subject`'s side of its traffic with `other` in `direction`.
    let accepts = |subject: PodId, direction, other: PodId| {
        let workload = universe.workload(subject);
        let remote = universe.remote(other);
        let network_policy = network_policies(subject, direction, other);
        judge(
            policies,
            direction,
            &workload,
            &remote,
            traffic,
            network_policy,
        )
        .accepted
    };
    let mut reached = BTreeMap::new();
    for from in PodId::all() {
        for to in PodId::all() {
            let both =
                accepts(from, Direction::Egress, to) && accepts(to, Direction::Ingress, from);
            reached.insert((from, to), both);
        }
    }
    reached
}

/// The table expected: every pair reaches, but where `denied` says not.
fn expect(denied: impl Fn(PodId, PodId) -> bool) -> BTreeMap<(PodId, PodId), bool> {
    let pairs = PodId::all().flat_map(|f| PodId::all().map(move |t| (f, t)));
    pairs.map(|(f, t)| ((f, t), !denied(f, t))).collect()
}

/// Both tables as upstream prints them (rows send, columns receive; `.`
/// reaches, `X` does not), the pairs that differ marked.
fn assert_tables(got: &BTreeMap<(PodId, PodId), bool>, want: &BTreeMap<(PodId, PodId), bool>) {
    if got == want {
        return;
    }
    let mut text = String::from("from\\to  ");
    for to in PodId::all() {
        text.push_str(&format!("{:<5}", to.name()));
    }
    for from in PodId::all() {
        text.push_str(&format!("\n{:<9}", from.name()));
        for to in PodId::all() {
            let mark = |reached| if reached { "." } else { "X" };
            let (g, w) = (got[&(from, to)], want[&(from, to)]);
            let cell = if g == w {
                mark(g).to_string()
            } else {
                format!("{}!", mark(g))
            };
            text.push_str(&format!("{cell:<5}"));
        }
    }
    panic!("reachability differs where marked `!` (the cell shows what the model said):\n{text}");
}

/// A policy from its spec's JSON.
fn policy(name: &str, spec: serde_json::Value) -> ClusterNetworkPolicy {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// A policy of `tier` whose rules are all of one direction.
fn cnp(
    name: &str,
    tier: &str,
    priority: u16,
    subject: serde_json::Value,
    direction: &str,
    rules: serde_json::Value,
) -> ClusterNetworkPolicy {
    let mut spec = serde_json::json!({"tier": tier, "priority": priority, "subject": subject});
    spec[direction] = rules;
    policy(name, spec)
}

fn namespace(name: &str) -> serde_json::Value {
    serde_json::json!({"namespaces": {"matchLabels": {"ns": name}}})
}

fn pod(namespace: &str, pod: &str) -> serde_json::Value {
    serde_json::json!({"pods": {
        "namespaceSelector": {"matchLabels": {"ns": namespace}},
        "podSelector": {"matchLabels": {"pod": pod}}}})
}

fn is(pod: PodId, namespace: &str) -> bool {
    pod.namespace() == namespace
}

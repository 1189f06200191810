//! Tests of [`plan`] on Kubernetes objects: the upstream e2e model
//! ([`model`]), and each feature and edge case on its own.

mod features;
mod first_packet;
mod growth;
mod incremental;
mod model;
mod named_ports;
pub(crate) mod rng;
mod scale;
mod services;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

use super::*;

pub const NODE: &str = "node-1";
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;

/// A pod as the tests build it: labelled `pod=<name>`, Running on
/// [`NODE`], serving 80 and 81 on TCP and UDP under upstream's names
/// (`serve-80-tcp`, ...).
pub struct TestPod {
    pub json: Value,
}

pub fn pod(namespace: &str, name: &str, ips: &[&str]) -> TestPod {
    let ports: Vec<Value> = [(80, "TCP"), (81, "TCP"), (80, "UDP"), (81, "UDP")]
        .iter()
        .map(|(port, protocol)| {
            let name = format!("serve-{port}-{}", protocol.to_lowercase());
            json!({"name": name, "containerPort": port, "protocol": protocol})
        })
        .collect();
    let ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    TestPod {
        json: json!({
            "metadata": {"namespace": namespace, "name": name, "labels": {"pod": name}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "ports": ports}]},
            "status": {"phase": "Running", "podIPs": ips}
        }),
    }
}

impl TestPod {
    pub fn on(mut self, node: &str) -> Self {
        self.json["spec"]["nodeName"] = json!(node);
        self
    }

    pub fn labels(mut self, labels: Value) -> Self {
        self.json["metadata"]["labels"] = labels;
        self
    }

    /// Replaces the container ports: (name, port, protocol).
    pub fn ports(mut self, ports: &[(&str, i32, &str)]) -> Self {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(name, port, protocol)| json!({"name": name, "containerPort": port, "protocol": protocol}))
            .collect();
        self.json["spec"]["containers"] = json!([{"name": "c", "ports": ports}]);
        self
    }

    pub fn host_network(mut self) -> Self {
        self.json["spec"]["hostNetwork"] = json!(true);
        self
    }

    pub fn phase(mut self, phase: &str) -> Self {
        self.json["status"]["phase"] = json!(phase);
        self
    }

    pub fn build(self) -> Pod {
        serde_json::from_value(self.json).unwrap()
    }
}

/// A namespace with `labels` and the name label the API server adds.
pub fn namespace(name: &str, mut labels: Value) -> Namespace {
    labels["kubernetes.io/metadata.name"] = json!(name);
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

pub fn policy(namespace: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(
        json!({"metadata": {"namespace": namespace, "name": name}, "spec": spec}),
    )
    .unwrap()
}

pub fn key(pod: &str) -> PodKey {
    let (namespace, name) = pod.split_once('/').unwrap();
    PodKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// One direction of a pod's computed policy, with the plan's peer
/// identities to look peers up in.
pub struct Side<'a> {
    pub allowed: &'a Allowed,
    addresses: &'a BTreeMap<IpAddr, u32>,
}

impl Side<'_> {
    /// Whether a packet of `protocol` to `port` with `peer` on the far
    /// side passes, as the datapath judges it (prefix and identity).
    pub fn allows(&self, peer: IpAddr, protocol: u8, port: u16) -> bool {
        let identity = self.addresses.get(&peer).copied();
        self.allowed.allows(peer, identity, protocol, port)
    }
}

impl PartialEq<Allowed> for Side<'_> {
    fn eq(&self, other: &Allowed) -> bool {
        self.allowed == other
    }
}

impl std::fmt::Debug for Side<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.allowed.fmt(f)
    }
}

impl std::ops::Deref for Side<'_> {
    type Target = Allowed;
    fn deref(&self) -> &Allowed {
        self.allowed
    }
}

/// A pod's computed policy, its directions as [`Side`]s.
pub struct Of<'a> {
    policy: &'a PodPolicy,
    pub ingress: Side<'a>,
    pub egress: Side<'a>,
}

impl std::ops::Deref for Of<'_> {
    type Target = PodPolicy;
    fn deref(&self) -> &PodPolicy {
        self.policy
    }
}

/// The computed policy of `pod` ("ns/name"), which must be in the plan.
pub fn of<'a>(plan: &'a Plan, pod: &str) -> Of<'a> {
    let policy = match plan.pods.get(&key(pod)) {
        Some(Ok(p)) => p,
        other => panic!("{pod}: {other:?}"),
    };
    let side = |allowed| Side {
        allowed,
        addresses: &plan.addresses,
    };
    Of {
        policy,
        ingress: side(&policy.ingress),
        egress: side(&policy.egress),
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The table of an isolated direction.
pub fn table(allowed: &Allowed) -> &Table {
    match allowed {
        Allowed::Only(table) => table,
        Allowed::All => panic!("not isolated"),
    }
}

/// A table's entries as "cidr ports" lines, sorted by CIDR: its prefixes,
/// and each address of an identity it names as a host prefix.
pub fn entries(side: &Side<'_>) -> Vec<String> {
    let t = table(side.allowed);
    let mut lines: Vec<(IpNetwork, String)> = t
        .entries
        .iter()
        .map(|e| (e.cidr, format!("{} {}", e.cidr, e.ports)))
        .collect();
    for (address, identity) in side.addresses {
        if let Some(ports) = t.peers.get(identity) {
            let host = IpNetwork::from(*address);
            lines.push((host, format!("{host} {ports}")));
        }
    }
    lines.sort();
    lines.into_iter().map(|(_, line)| line).collect()
}

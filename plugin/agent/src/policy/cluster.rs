//! The cluster as policies see it: pods (as subjects and as peers) and
//! namespaces' labels.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::identity::{IdentityKey, IdentityNumbers, Member, PeerIdentity, Relevant};
use super::ports::PortRange;
use super::selector::matches;
use crate::protocol::Protocol;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The label the API server puts on every namespace, naming it.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The addresses of `node`'s pods as their ADD recorded them (by namespace
/// and name; see `flatnet_datapath::node::first_packet`).
#[derive(Debug, Clone, Default)]
pub struct LocalIps {
    pub node: String,
    pub ips: BTreeMap<(String, String), Vec<IpAddr>>,
}

/// What the computation needs to know about a pod.
pub struct PodView<'a> {
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// `status.podIPs` (or `status.podIP`), sorted; unparsable ones left out.
    pub ips: Vec<IpAddr>,
}

impl<'a> PodView<'a> {
    pub fn new(pod: &'a Pod) -> Self {
        let status = pod.status.as_ref();
        let listed = status.and_then(|s| s.pod_ips.as_ref());
        let mut ips: Vec<IpAddr> = match listed {
            Some(ips) if !ips.is_empty() => ips.iter().filter_map(|i| i.ip.parse().ok()).collect(),
            _ => status
                .and_then(|s| s.pod_ip.as_ref())
                .and_then(|i| i.parse().ok())
                .into_iter()
                .collect(),
        };
        ips.sort();
        ips.dedup();
        PodView {
            pod,
            namespace: pod.metadata.namespace.as_deref().unwrap_or_default(),
            name: pod.metadata.name.as_deref().unwrap_or_default(),
            labels: pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            ips,
        }
    }

    /// With the addresses ADD recorded (`local`) when the status has none
    /// yet and the pod is on `local`'s node: kubelet writes them seconds
    /// after ADD, and policy must not wait for that.
    pub fn or_recorded(mut self, local: &LocalIps) -> Self {
        if self.ips.is_empty()
            && self.node() == Some(local.node.as_str())
            && let Some(ips) = local
                .ips
                .get(&(self.namespace.to_string(), self.name.to_string()))
        {
            self.ips = ips.clone();
        }
        self
    }

    /// What the pod shows to the policies whose concerns are `relevant`.
    pub fn member(&self, relevant: &Relevant) -> Member {
        let labels = self
            .labels
            .iter()
            .filter(|(k, _)| relevant.label_keys.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut named_ports: Vec<(String, String, i32)> = Vec::new();
        if relevant.named_ports {
            let containers = self.pod.spec.iter().flat_map(|s| &s.containers);
            named_ports = containers
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|p| {
                    let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                    Some((p.name.clone()?, protocol, p.container_port))
                })
                .collect();
            named_ports.sort_unstable();
            named_ports.dedup();
        }
        Member {
            namespace: self.namespace.to_string(),
            labels,
            named_ports,
        }
    }

    /// Succeeded or Failed: its containers are gone, its IPs may be reused.
    pub fn finished(&self) -> bool {
        let phase = self.pod.status.as_ref().and_then(|s| s.phase.as_deref());
        matches!(phase, Some("Succeeded" | "Failed"))
    }

    pub fn host_network(&self) -> bool {
        self.pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
    }

    pub fn node(&self) -> Option<&'a str> {
        self.pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }

    /// The pod's container ports named `name` for `protocol`.
    pub fn named_ports(&self, protocol: Protocol, name: &str) -> impl Iterator<Item = PortRange> {
        let containers = self.pod.spec.iter().flat_map(|s| &s.containers);
        containers
            .flat_map(|c| c.ports.iter().flatten())
            .filter(move |p| {
                p.name.as_deref() == Some(name)
                    && Protocol::from_kube(p.protocol.as_deref()) == Some(protocol)
            })
            .filter_map(|p| u16::try_from(p.container_port).ok())
            .map(move |port| PortRange::new(protocol, port, port))
    }
}

/// The pods that can be peers, and the namespaces' labels.
pub struct Cluster<'a> {
    /// Pods with an IP that have not finished, host-network ones included
    /// (their IPs are the node's; upstream selectors match them too).
    pub peers: Vec<PodView<'a>>,
    /// The identities of the peers' addresses, by number.
    pub identities: Vec<PeerIdentity>,
    /// Every peer address's identity number.
    pub addresses: HashMap<IpAddr, u32>,
    namespaces: BTreeMap<&'a str, &'a BTreeMap<String, String>>,
}

impl<'a> Cluster<'a> {
    /// The cluster with its peers numbered as `numbers` says (what
    /// `relevant` keeps of them tells identities apart).
    pub fn new(
        pods: &[&'a Pod],
        namespaces: &[&'a Namespace],
        local: &LocalIps,
        (relevant, numbers): (&Relevant, &mut IdentityNumbers),
    ) -> Self {
        let peers: Vec<PodView<'a>> = pods
            .iter()
            .map(|p| PodView::new(p).or_recorded(local))
            .filter(|p| !p.ips.is_empty() && !p.finished())
            .collect();
        let identities = identities(&peers, relevant, numbers);
        let addresses = identities
            .iter()
            .flat_map(|i| i.addresses.iter().map(|a| (*a, i.number)))
            .collect();
        let namespaces = namespaces
            .iter()
            .filter_map(|n| {
                let labels = n.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
                n.metadata.name.as_deref().map(|name| (name, labels))
            })
            .collect();
        Cluster {
            peers,
            identities,
            addresses,
            namespaces,
        }
    }

    /// A namespace not seen yet (the watch lags) is taken to have only the
    /// label the API server gives every namespace.
    pub fn namespace_matches(&self, selector: &LabelSelector, namespace: &str) -> bool {
        match self.namespaces.get(namespace) {
            Some(labels) => matches(selector, labels),
            None => {
                let labels =
                    BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), namespace.to_string())]);
                matches(selector, &labels)
            }
        }
    }
}

/// The identities of `peers`' addresses, sorted by number.
pub fn identities(
    peers: &[PodView<'_>],
    relevant: &Relevant,
    numbers: &mut IdentityNumbers,
) -> Vec<PeerIdentity> {
    let mut by_address: BTreeMap<IpAddr, BTreeMap<Member, usize>> = BTreeMap::new();
    for (i, peer) in peers.iter().enumerate() {
        let member = peer.member(relevant);
        for ip in &peer.ips {
            by_address
                .entry(*ip)
                .or_default()
                .entry(member.clone())
                .or_insert(i);
        }
    }
    let mut by_key: BTreeMap<IdentityKey, PeerIdentity> = BTreeMap::new();
    for (ip, members) in by_address {
        let key: IdentityKey = members.keys().cloned().collect();
        let identity = by_key.entry(key).or_insert_with(|| PeerIdentity {
            number: 0,
            members: members.values().copied().collect(),
            addresses: Vec::new(),
        });
        identity.addresses.push(ip);
    }
    // Hinted numbers first, so a fresh one never takes a hint another
    // identity would have had.
    for (key, identity) in &mut by_key {
        identity.number = numbers.number(key, &identity.addresses);
    }
    let mut identities: Vec<PeerIdentity> = by_key.into_values().collect();
    identities.sort_by_key(|i| i.number);
    identities
}

//! The cluster as policies see it: pods (as subjects and as peers) and
//! namespaces' labels.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::network_policy::Selector;
use k8s_openapi::api::core::v1::Namespace;

use super::Pod;
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
#[derive(Clone)]
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
        PodView {
            pod,
            namespace: &pod.namespace,
            name: &pod.name,
            labels: &pod.labels,
            ips: pod.ips.to_vec(),
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

    /// Succeeded or Failed: its containers are gone, its IPs may be reused.
    pub fn finished(&self) -> bool {
        matches!(self.pod.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    pub fn host_network(&self) -> bool {
        self.pod.host_network
    }

    pub fn node(&self) -> Option<&'a str> {
        self.pod.node_name.as_deref()
    }

    /// The pod's container ports named `name` for `protocol`.
    pub fn named_ports(&self, protocol: Protocol, name: &str) -> impl Iterator<Item = PortRange> {
        let containers = self.pod.containers.iter();
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
    /// `pods`: every pod's view (with the addresses ADD recorded).
    pub fn new(
        pods: Vec<PodView<'a>>,
        namespaces: &[&'a Namespace],
        (relevant, numbers): (&Relevant, &mut IdentityNumbers),
    ) -> Self {
        let peers: Vec<PodView<'a>> = pods
            .into_iter()
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
    pub fn namespace_matches(&self, selector: &Selector, namespace: &str) -> bool {
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

/// What a pod shows to selectors, borrowed from it: the pods of a large
/// cluster are grouped by this without copying their labels, and only each
/// distinct one becomes a [`Member`].
#[derive(Clone, PartialEq, Eq, Hash)]
struct MemberView<'a> {
    namespace: &'a str,
    labels: Vec<(&'a str, &'a str)>,
    named_ports: Vec<(&'a str, &'a str, i32)>,
}

impl<'a> PodView<'a> {
    fn member_view(&self, relevant: &Relevant) -> MemberView<'a> {
        let labels = self
            .labels
            .iter()
            .filter(|(k, _)| relevant.label_keys.contains(*k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut named_ports = Vec::new();
        if relevant.named_ports {
            let containers = self.pod.containers.iter();
            named_ports = containers
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|p| {
                    let protocol = p.protocol.as_deref().unwrap_or("TCP");
                    Some((p.name.as_deref()?, protocol, p.container_port))
                })
                .collect();
            named_ports.sort_unstable();
            named_ports.dedup();
        }
        MemberView {
            namespace: self.namespace,
            labels,
            named_ports,
        }
    }
}

impl PodView<'_> {
    /// What this pod shows to selectors that look at `relevant`.
    pub fn member(&self, relevant: &Relevant) -> Member {
        self.member_view(relevant).to_member()
    }
}

impl MemberView<'_> {
    fn to_member(&self) -> Member {
        Member {
            namespace: self.namespace.to_string(),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            named_ports: self
                .named_ports
                .iter()
                .map(|(name, protocol, port)| (name.to_string(), protocol.to_string(), *port))
                .collect(),
        }
    }
}

/// The identities of `peers`' addresses, sorted by number.
///
/// Each distinct member is found once (by a borrowed view, hashed), and
/// addresses are grouped by the set of member numbers they show; only
/// the identities themselves are compared as [`IdentityKey`]s. Numbers
/// are handed out in key order, as before.
pub fn identities(
    peers: &[PodView<'_>],
    relevant: &Relevant,
    numbers: &mut IdentityNumbers,
) -> Vec<PeerIdentity> {
    // Distinct members, each with the first peer that shows it.
    let mut interned: HashMap<MemberView<'_>, u32> = HashMap::new();
    let mut members: Vec<(MemberView<'_>, usize)> = Vec::new();
    let mut by_address: HashMap<IpAddr, Vec<u32>> = HashMap::new();
    for (i, peer) in peers.iter().enumerate() {
        let view = peer.member_view(relevant);
        let id = match interned.get(&view) {
            Some(&id) => id,
            None => {
                let id = members.len() as u32;
                interned.insert(view.clone(), id);
                members.push((view, i));
                id
            }
        };
        for ip in &peer.ips {
            let ids = by_address.entry(*ip).or_default();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    // Addresses grouped by what their pods show.
    let mut groups: HashMap<Vec<u32>, Vec<IpAddr>> = HashMap::new();
    for (ip, mut ids) in by_address {
        ids.sort_unstable();
        groups.entry(ids).or_default().push(ip);
    }
    let owned: Vec<Member> = members.iter().map(|(view, _)| view.to_member()).collect();
    let mut keyed: Vec<(IdentityKey, Vec<u32>, Vec<IpAddr>)> = groups
        .into_iter()
        .map(|(ids, mut addresses)| {
            addresses.sort_unstable();
            let key: IdentityKey = ids.iter().map(|&id| owned[id as usize].clone()).collect();
            (key, ids, addresses)
        })
        .collect();
    // Hinted numbers first, so a fresh one never takes a hint another
    // identity would have had; in key order, as numbers were always given.
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut identities: Vec<PeerIdentity> = keyed
        .into_iter()
        .map(|(key, ids, addresses)| {
            // One peer per member, in the members' (the key's) order.
            let mut representatives: Vec<(&Member, usize)> = ids
                .iter()
                .map(|&id| (&owned[id as usize], members[id as usize].1))
                .collect();
            representatives.sort_unstable_by(|a, b| a.0.cmp(b.0));
            PeerIdentity {
                number: numbers.number(&key, &addresses),
                members: representatives.into_iter().map(|(_, peer)| peer).collect(),
                addresses,
            }
        })
        .collect();
    identities.sort_by_key(|i| i.number);
    identities
}

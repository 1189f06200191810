//! Kubernetes NetworkPolicy (networking.k8s.io/v1), computed: for each pod
//! on this node, whether it is isolated for ingress and for egress, and for
//! each isolated direction the traffic its policies allow, as a
//! longest-prefix-match [`Table`] ready for a BPF LPM trie ([`plan`]).
//!
//! Pure: no BPF, no watches. The result is sorted and compares cheaply,
//! so the agent can rewrite only the pods whose result changed
//! ([`Plan::changed_since`]).
//!
//! Semantics follow upstream: a pod is isolated for a direction once a
//! policy selecting it has that policy type, and then only what the union
//! of those policies' rules allows gets through. Named ports mean the
//! destination pod's container port of that name and protocol (for
//! ingress the selected pod's own, for egress each peer pod's). Pods
//! without IPs or in phase Succeeded/Failed are no peers; host-network
//! pods are peers (their IPs are the node's) but never have policy
//! computed for them, as their traffic is the node's.

pub mod records_watch;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod scale_fixture;
pub mod sync;
pub mod watch;

pub mod changes;
mod cluster;
pub mod identity;
pub mod incremental;
mod isolation;
mod kind_watch;
pub mod network_policy;
pub mod object_store;
pub mod pod;
mod ports;
mod rules;
mod selector;
pub mod services;
mod table;
pub mod tiers;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
pub use network_policy::NetworkPolicy;

pub use ports::{MAX_PORT_RANGES, PortRange, PortSet};
pub use table::{Entry, Table};

use identity::{IdentityNumbers, Relevant};
use incremental::PeerIndex;
pub use isolation::IsolationByPolicy;
pub use pod::Pod;

pub use cluster::LocalIps;
use cluster::{Cluster, PodView};
use flatnet_datapath::node::first_packet::Isolation;
use rules::Policy;

/// A pod, by namespace and name (shared with the pod store's copy where
/// there is one: the index holds one per pod of the cluster).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Ingress (traffic to the pod) or egress (traffic from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        })
    }
}

/// What one direction of a pod allows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Allowed {
    /// Not isolated: no policy selecting the pod has this type.
    All,
    /// Isolated: only what the table allows (the peer's address looked
    /// up; not in the table means denied).
    Only(Table),
}

impl Allowed {
    /// Whether a packet of IP protocol `protocol` to `port`, with `peer`
    /// (of identity `identity`, if it has one) on the far side, is allowed.
    pub fn allows(&self, peer: IpAddr, identity: Option<u32>, protocol: u8, port: u16) -> bool {
        match self {
            Allowed::All => true,
            Allowed::Only(table) => table.allows(peer, identity, protocol, port),
        }
    }

    /// The identities its table names.
    fn identities(&self) -> impl Iterator<Item = u32> + '_ {
        let table = match self {
            Allowed::All => None,
            Allowed::Only(table) => Some(table),
        };
        table.into_iter().flat_map(|t| t.peers.keys().copied())
    }
}

/// The result for one pod on this node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodPolicy {
    /// The pod's IPs, sorted (none yet while it is being set up).
    pub ips: Vec<IpAddr>,
    /// The names of the policies selecting the pod (all in its namespace),
    /// sorted.
    pub policies: Vec<String>,
    pub ingress: Allowed,
    pub egress: Allowed,
}

/// Why a pod's policy could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// One entry would allow more port ranges, after merging, than a map
    /// value holds ([`MAX_PORT_RANGES`]).
    #[error(
        "pod {pod}: {direction} policy for {peer} needs {ranges} port ranges, more than the {max} a map entry holds (policies: {})",
        .policies.join(", "),
        max = MAX_PORT_RANGES
    )]
    TooManyPortRanges {
        pod: PodKey,
        direction: Direction,
        peer: String,
        ranges: usize,
        policies: Vec<String>,
    },
}

/// The policy of every pod on this node that can have one.
///
/// A pod whose policy cannot be computed has its error instead of a
/// result. Nothing is made up for it: allowing the entry's traffic on Any
/// would let through what the policies deny, and denying it would cut
/// traffic they allow, either silently. The caller logs the error and
/// decides; keeping what is in place for the pod (or, for a new pod,
/// leaving it without connectivity in that direction) is the safe choice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub pods: BTreeMap<PodKey, Result<PodPolicy, PolicyError>>,
    /// The identity of every address whose identity a table names: all
    /// the node needs to know about peers (see [`identity`]).
    pub addresses: BTreeMap<IpAddr, u32>,
}

impl Plan {
    /// Whether `pod`'s `direction` lets IP protocol `protocol` to `port`
    /// through with `peer` on the far side; None: `pod` has no result.
    pub fn allows(
        &self,
        pod: &PodKey,
        direction: Direction,
        peer: IpAddr,
        (protocol, port): (u8, u16),
    ) -> Option<bool> {
        let Some(Ok(policy)) = self.pods.get(pod) else {
            return None;
        };
        let allowed = match direction {
            Direction::Ingress => &policy.ingress,
            Direction::Egress => &policy.egress,
        };
        let identity = self.addresses.get(&peer).copied();
        Some(allowed.allows(peer, identity, protocol, port))
    }

    /// The pods whose result differs from `previous`, gone ones included,
    /// sorted: the pods whose maps need rewriting.
    pub fn changed_since(&self, previous: &Plan) -> Vec<PodKey> {
        let keys: BTreeSet<&PodKey> = self.pods.keys().chain(previous.pods.keys()).collect();
        keys.into_iter()
            .filter(|k| self.pods.get(*k) != previous.pods.get(*k))
            .cloned()
            .collect()
    }
}

/// What `policies` mean for the pods on node `node`: every pod scheduled
/// there that does not use the host network and has not finished. `pods`
/// and `namespaces` are the whole cluster's (peers can be anywhere).
pub fn plan(
    node: &str,
    policies: &[NetworkPolicy],
    pods: &[Pod],
    namespaces: &[Namespace],
) -> Plan {
    let policies: Vec<&NetworkPolicy> = policies.iter().collect();
    let pods: Vec<&Pod> = pods.iter().collect();
    let namespaces: Vec<&Namespace> = namespaces.iter().collect();
    plan_of(
        node,
        (&policies, &pods, &namespaces),
        &[],
        &LocalIps::default(),
        &mut IdentityNumbers::default(),
    )
}

/// Which directions each namespace's policies isolate: what a new pod of
/// that namespace starts with until its own policy is written.
pub fn isolation(policies: &[&NetworkPolicy]) -> Isolation {
    IsolationByPolicy::of(policies).isolation()
}

/// The cluster's objects a plan reads: NetworkPolicies, Pods, Namespaces.
pub type Objects<'o, 'a> = (&'o [&'a NetworkPolicy], &'o [&'a Pod], &'o [&'a Namespace]);

/// [`plan`] on borrowed objects (a watch cache's, not cloned).
/// `frontends`: the cluster's Services, whose ClusterIPs an egress table
/// allows where it allows all their backends (see [`services`]).
/// `numbers`: the identity numbers of the plans before (see [`identity`]);
/// those this plan does not use are forgotten.
pub fn plan_of(
    node: &str,
    objects: Objects<'_, '_>,
    frontends: &[crate::services::Frontend<'_>],
    local: &LocalIps,
    numbers: &mut IdentityNumbers,
) -> Plan {
    plan_indexed(node, objects, frontends, local, numbers).0
}

/// [`plan_of`], and what it saw, for the changes that need no whole pass
/// (see [`incremental`]).
pub fn plan_indexed(
    node: &str,
    (policies, pods, namespaces): Objects<'_, '_>,
    frontends: &[crate::services::Frontend<'_>],
    local: &LocalIps,
    numbers: &mut IdentityNumbers,
) -> (Plan, PeerIndex) {
    // Each pod seen once: as a subject (on this node) and as a peer.
    let views: Vec<PodView<'_>> = pods
        .iter()
        .map(|p| PodView::new(p).or_recorded(local))
        .collect();
    let subjects: Vec<PodView<'_>> = views
        .iter()
        .filter(|p| p.node() == Some(node) && !p.host_network() && !p.finished())
        .cloned()
        .collect();
    // Peers are resolved only for policies that select a pod here.
    let mut relevant: Vec<&NetworkPolicy> = policies
        .iter()
        .copied()
        .filter(|p| subjects.iter().any(|s| rules::selects(p, s)))
        .collect();
    relevant.sort_by_key(|p| (&p.namespace, &p.name));
    let relevant_of = Relevant::of(&relevant);
    let cluster = Cluster::new(views, namespaces, (&relevant_of, numbers));
    let compiled: Vec<(&NetworkPolicy, Policy<'_>)> = relevant
        .into_iter()
        .map(|p| (p, Policy::compile(p, &cluster)))
        .collect();

    // Pods selected by the same policies have the same tables (for
    // ingress, given the same named container ports): each distinct
    // combination is flattened once. Pods of one Deployment share both.
    let mut tables = TableCache::default();
    let mut plan = Plan::default();
    for subject in &subjects {
        let selecting: Vec<usize> = compiled
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| rules::selects(p, subject))
            .map(|(i, _)| i)
            .collect();
        let key = pod_key(subject);
        let result = pod_policy(
            &key,
            subject,
            &selecting,
            (&compiled, frontends),
            &cluster,
            &mut tables,
        );
        plan.pods.insert(key, result);
    }
    let named: HashSet<u32> = plan
        .pods
        .values()
        .flatten()
        .flat_map(|p| p.ingress.identities().chain(p.egress.identities()))
        .collect();
    plan.addresses = cluster
        .addresses
        .iter()
        .filter(|(_, n)| named.contains(n))
        .map(|(a, n)| (*a, *n))
        .collect();
    numbers.retain(&named);
    let mut index = PeerIndex {
        node: node.to_string(),
        relevant: relevant_of,
        egress: tables.pre_egress,
        ..PeerIndex::default()
    };
    index.index_peers(&cluster, &named);
    index.subjects = subjects
        .iter()
        .map(|s| (pod_key(s), s.labels.clone()))
        .collect();
    index.selecting = compiled
        .iter()
        .map(|(p, _)| (p.namespace.to_string(), p.name.to_string()))
        .collect();
    index.set_services(frontends);
    (plan, index)
}

pub(crate) fn pod_key(view: &PodView<'_>) -> PodKey {
    PodKey {
        namespace: view.pod.namespace.clone(),
        name: view.pod.name.clone(),
    }
}

/// The named container ports of a pod, (name, protocol, port), sorted: all
/// that an ingress table depends on besides its policies.
type NamedPorts<'a> = Vec<(&'a str, Option<&'a str>, i32)>;

type TableKey<'a> = (Direction, Vec<usize>, NamedPorts<'a>);

#[derive(Default)]
struct TableCache<'a> {
    tables: HashMap<TableKey<'a>, Result<Allowed, table::Overflow>>,
    /// Each egress table before its ClusterIPs were added.
    pre_egress: Vec<Table>,
}

fn named_ports<'a>(subject: &PodView<'a>) -> NamedPorts<'a> {
    let containers = subject.pod.containers.iter();
    let mut ports: NamedPorts<'a> = containers
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.as_deref()?, p.protocol.as_deref(), p.container_port)))
        .collect();
    ports.sort_unstable();
    ports
}

fn pod_policy<'a>(
    key: &PodKey,
    subject: &PodView<'a>,
    selecting: &[usize],
    (compiled, frontends): (
        &[(&'a NetworkPolicy, Policy<'a>)],
        &[crate::services::Frontend<'a>],
    ),
    cluster: &Cluster<'a>,
    cache: &mut TableCache<'a>,
) -> Result<PodPolicy, PolicyError> {
    let mut table = |direction: Direction| {
        let isolating: Vec<usize> = selecting
            .iter()
            .copied()
            .filter(|&i| match direction {
                Direction::Ingress => compiled[i].1.isolates_ingress(),
                Direction::Egress => compiled[i].1.isolates_egress(),
            })
            .collect();
        if isolating.is_empty() {
            return Ok(Allowed::All);
        }
        // Egress rules resolve named ports on the peers: the subject
        // does not matter.
        let ports = match direction {
            Direction::Ingress => named_ports(subject),
            Direction::Egress => Vec::new(),
        };
        let pre_egress = &mut cache.pre_egress;
        let result = cache
            .tables
            .entry((direction, isolating, ports))
            .or_insert_with_key(|(_, isolating, _)| {
                let mut allows = rules::Allows::default();
                for &i in isolating {
                    let policy = &compiled[i].1;
                    match direction {
                        Direction::Ingress => policy.ingress_allows(subject, cluster, &mut allows),
                        Direction::Egress => policy.egress_allows(cluster, &mut allows),
                    }
                }
                let mut table = table::flatten(&allows.cidrs)?;
                table.peers = table::peer_ports(&allows.peers)?;
                if direction == Direction::Egress {
                    pre_egress.push(table.clone());
                }
                if direction == Direction::Egress && !frontends.is_empty() {
                    // A ClusterIP is judged by its backends: withheld from
                    // the ipBlocks that contain it, allowed on the ports
                    // whose backends this table allows.
                    let backends = (&table, &cluster.addresses);
                    let through = services::cluster_ip_allows(backends, frontends);
                    services::withhold_cluster_ips(backends, frontends, &mut allows.cidrs);
                    allows.cidrs.extend(through);
                    let peers = std::mem::take(&mut table.peers);
                    table = table::flatten(&allows.cidrs)?;
                    table.peers = peers;
                }
                Ok(Allowed::Only(table))
            });
        result.clone().map_err(|o| PolicyError::TooManyPortRanges {
            pod: key.clone(),
            direction,
            peer: o.peer,
            ranges: o.ranges,
            policies: o.policies,
        })
    };
    let ingress = table(Direction::Ingress)?;
    let egress = table(Direction::Egress)?;
    let mut policies: Vec<String> = selecting
        .iter()
        .map(|&i| compiled[i].1.name.to_string())
        .collect();
    policies.sort();
    policies.dedup();
    Ok(PodPolicy {
        ips: subject.ips.clone(),
        policies,
        ingress,
        egress,
    })
}

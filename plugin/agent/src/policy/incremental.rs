//! What a whole pass leaves behind so that most later changes need none:
//! a remote pod coming, going or changing, and a NetworkPolicy that selects
//! no pod here, change no table of this node's pods, only the identity of
//! a few peer addresses (or nothing at all). Each change is checked against
//! what the last pass saw; anything the check cannot prove harmless (a pod
//! of this node, a policy selecting one, an identity no table has been
//! computed for, an address two pods share, a Service backend whose verdict
//! would change, a namespace) asks for a whole pass instead.
//!
//! Pure: the agent feeds it the changed objects and applies the address
//! changes it returns (`PolicySync::update_addresses`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use super::network_policy::NetworkPolicy;

use super::cluster::{Cluster, PodView};
use super::identity::{Member, Relevant};
use ipnetwork::IpNetwork;
use smallvec::SmallVec;

use super::ports::PortSet;
use super::services::{cluster_ip_allows, withhold_cluster_ips};
use super::table::{Allow, Table};
use super::{Pod, PodKey, rules};
use crate::services::{Frontend, FrontendPort};

/// Why a change needs a whole pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WholePass(pub &'static str);

/// A policy's namespace and name.
pub type PolicyKey = (String, String);

/// What one Service shows egress policy: its ClusterIPs and ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceView {
    cluster_ips: Vec<IpAddr>,
    ports: Vec<FrontendPort>,
}

/// What a Service adds to an egress table: its ClusterIP entries, and the
/// excepts it puts into the entries that hold a ClusterIP it withholds.
type Contribution = (Vec<(IpNetwork, PortSet)>, Vec<IpNetwork>);

impl ServiceView {
    fn of(frontend: &Frontend<'_>) -> Self {
        ServiceView {
            cluster_ips: frontend.cluster_ips.clone(),
            ports: frontend.ports.clone(),
        }
    }

    /// What it adds to `table`, as the whole pass's own functions
    /// (`services::cluster_ip_allows`, `services::withhold_cluster_ips`)
    /// compute it.
    fn contribution(&self, table: &Table, addresses: &HashMap<IpAddr, u32>) -> Contribution {
        let frontend = [Frontend {
            namespace: "",
            name: "",
            cluster_ips: self.cluster_ips.clone(),
            external_ips: Vec::new(),
            affinity: None,
            external_local: false,
            health_check_node_port: None,
            local_ready_endpoints: 0,
            ports: self.ports.clone(),
        }];
        let backends = (table, addresses);
        let allowed = cluster_ip_allows(backends, &frontend)
            .into_iter()
            .map(|a| (a.cidr, a.ports))
            .collect();
        let mut entries: Vec<Allow<'_>> = table
            .entries
            .iter()
            .map(|e| Allow {
                cidr: e.cidr,
                except: Vec::new(),
                ports: e.ports.clone(),
                policy: "",
            })
            .collect();
        withhold_cluster_ips(backends, &frontend, &mut entries);
        (
            allowed,
            entries.into_iter().flat_map(|a| a.except).collect(),
        )
    }
}

/// The last whole pass's view of the cluster, kept up to date by the
/// changes it let through.
#[derive(Debug, Default)]
pub struct PeerIndex {
    pub(super) node: String,
    pub(super) relevant: Relevant,
    /// This node's pods, with their namespace and labels (what decides
    /// whether a policy selects them).
    pub(super) subjects: HashMap<PodKey, BTreeMap<String, String>>,
    /// The policies selecting a pod here.
    pub(super) selecting: HashSet<PolicyKey>,
    /// Each identity of one member the last pass numbered, with its number
    /// when a table names it.
    pub(super) members: HashMap<Member, Option<u32>>,
    /// Peer addresses by identity: named ones (those a table names), the
    /// others, and those several pods share (host network).
    pub(super) named: HashMap<IpAddr, u32>,
    pub(super) unnamed: HashSet<IpAddr>,
    pub(super) shared: HashSet<IpAddr>,
    /// Every peer pod's addresses.
    pub(super) pods: HashMap<PodKey, Addresses>,
    /// The distinct egress tables of this node's pods before ClusterIPs
    /// were added: what decides which ClusterIPs they earn.
    pub(super) egress: Vec<Table>,
    /// Each Service as egress policy sees it, and each backend address's
    /// (protocol, target port) uses.
    pub(super) services: HashMap<PolicyKey, ServiceView>,
    pub(super) backends: HashMap<IpAddr, Uses>,
}

/// A pod's addresses: one inline (most pods), two or more allocated.
pub(super) type Addresses = SmallVec<[IpAddr; 1]>;

/// A backend address's (protocol, target port) uses: up to two inline.
pub(super) type Uses = SmallVec<[(u8, u16); 2]>;

impl PeerIndex {
    /// Takes every peer's addresses and identity from `cluster`.
    pub(super) fn index_peers(&mut self, cluster: &Cluster<'_>, named: &HashSet<u32>) {
        let mut holders: HashMap<IpAddr, usize> = HashMap::new();
        for peer in &cluster.peers {
            for ip in &peer.ips {
                *holders.entry(*ip).or_default() += 1;
            }
            self.pods
                .insert(super::pod_key(peer), Addresses::from_slice(&peer.ips));
        }
        self.shared = holders
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(ip, _)| ip)
            .collect();
        for identity in &cluster.identities {
            let number = named.contains(&identity.number).then_some(identity.number);
            if let [member] = identity.members[..] {
                let member = cluster.peers[member].member(&self.relevant);
                self.members.insert(member, number);
            }
            for address in &identity.addresses {
                match number {
                    Some(n) => {
                        self.named.insert(*address, n);
                    }
                    None => {
                        self.unnamed.insert(*address);
                    }
                }
            }
        }
    }

    /// Remembers `frontends` as the Services the tables were computed with.
    pub(super) fn set_services(&mut self, frontends: &[Frontend<'_>]) {
        self.services = frontends
            .iter()
            .map(|f| {
                let key = (f.namespace.to_string(), f.name.to_string());
                (key, ServiceView::of(f))
            })
            .collect();
        self.backends.clear();
        for view in self.services.values() {
            add_backends(&mut self.backends, view);
        }
    }

    /// Pod `key` changed (`pod`: as it is now; None: deleted). The address
    /// changes for the plan (None: the address has no named identity any
    /// more), or why a whole pass is needed.
    pub fn pod_changed(
        &mut self,
        key: &PodKey,
        pod: Option<&Pod>,
        changes: &mut BTreeMap<IpAddr, Option<u32>>,
    ) -> Result<(), WholePass> {
        if self.subjects.contains_key(key) {
            return Err(WholePass("a pod of this node changed"));
        }
        let view = pod.map(PodView::new);
        let new_ips: Vec<IpAddr> = match &view {
            Some(v)
                if v.node() == Some(self.node.as_str()) && !v.host_network() && !v.finished() =>
            {
                return Err(WholePass("a pod came to this node"));
            }
            Some(v) if v.host_network() => return Err(WholePass("a host-network pod changed")),
            Some(v) if !v.finished() => v.ips.clone(),
            _ => Vec::new(),
        };
        let old_ips = self.pods.get(key).cloned().unwrap_or_default();
        let number = match &view {
            Some(v) if !new_ips.is_empty() => {
                let member = v.member(&self.relevant);
                match self.members.get(&member) {
                    Some(number) => *number,
                    None => return Err(WholePass("a peer of an identity not seen before")),
                }
            }
            _ => None,
        };
        for ip in &old_ips {
            if self.shared.contains(ip) {
                return Err(WholePass("an address several pods share changed"));
            }
        }
        for ip in new_ips.iter().filter(|ip| !old_ips.contains(ip)) {
            if self.named.contains_key(ip) || self.unnamed.contains(ip) {
                return Err(WholePass("an address another pod holds"));
            }
        }
        // A Service backend's new identity must earn its ClusterIPs what
        // the old one did, in every egress table.
        for ip in old_ips.iter().chain(&new_ips) {
            let before = self.named.get(ip).copied();
            let after = if new_ips.contains(ip) { number } else { None };
            if before != after && !self.backend_verdicts_kept(*ip, before, after) {
                return Err(WholePass("a Service backend's verdict changed"));
            }
        }
        for ip in &old_ips {
            self.named.remove(ip);
            self.unnamed.remove(ip);
            changes.insert(*ip, None);
        }
        for ip in &new_ips {
            match number {
                Some(n) => {
                    self.named.insert(*ip, n);
                }
                None => {
                    self.unnamed.insert(*ip);
                }
            }
            changes.insert(*ip, number);
        }
        match pod {
            Some(pod) if !new_ips.is_empty() => {
                let key = PodKey {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                };
                self.pods.insert(key, Addresses::from_vec(new_ips));
            }
            _ => {
                self.pods.remove(key);
            }
        }
        Ok(())
    }

    fn backend_verdicts_kept(&self, ip: IpAddr, before: Option<u32>, after: Option<u32>) -> bool {
        let Some(uses) = self.backends.get(&ip) else {
            return true;
        };
        self.egress.iter().all(|table| {
            uses.iter().all(|(protocol, port)| {
                table.allows(ip, before, *protocol, *port)
                    == table.allows(ip, after, *protocol, *port)
            })
        })
    }

    /// Policy `key` changed (`policy`: as it is now; None: deleted).
    pub fn policy_changed(
        &self,
        key: &PolicyKey,
        policy: Option<&NetworkPolicy>,
    ) -> Result<(), WholePass> {
        if self.selecting.contains(key) {
            return Err(WholePass("a policy selecting a pod here changed"));
        }
        if let Some(policy) = policy
            && self
                .subjects
                .iter()
                .any(|(pod, labels)| rules::selects_labels(policy, &pod.namespace, labels))
        {
            return Err(WholePass("a policy now selects a pod here"));
        }
        Ok(())
    }

    /// The Services `keys` are now `frontends` (those of them that have
    /// one): fine when each earns what it did in every egress table.
    pub fn services_changed(
        &mut self,
        keys: &BTreeSet<PolicyKey>,
        frontends: &[Frontend<'_>],
    ) -> Result<(), WholePass> {
        let empty = ServiceView::default();
        let mut changed = Vec::new();
        for key in keys {
            let now = frontends
                .iter()
                .find(|f| f.namespace == key.0 && f.name == key.1)
                .map(ServiceView::of);
            let before = self.services.get(key);
            if before == now.as_ref() {
                continue;
            }
            let same = self.egress.iter().all(|table| {
                let after = now.as_ref().unwrap_or(&empty);
                let before = before.unwrap_or(&empty);
                before.contribution(table, &self.named) == after.contribution(table, &self.named)
            });
            if !same {
                return Err(WholePass("a Service's ClusterIP verdict changed"));
            }
            changed.push((key.clone(), now));
        }
        for (key, now) in changed {
            if let Some(before) = self.services.remove(&key) {
                remove_backends(&mut self.backends, &before);
            }
            if let Some(now) = now {
                add_backends(&mut self.backends, &now);
                self.services.insert(key, now);
            }
        }
        Ok(())
    }
}

fn add_backends(backends: &mut HashMap<IpAddr, Uses>, view: &ServiceView) {
    for port in &view.ports {
        for (ip, target) in &port.backends {
            backends
                .entry(*ip)
                .or_default()
                .push((port.protocol.number(), *target));
        }
    }
}

fn remove_backends(backends: &mut HashMap<IpAddr, Uses>, view: &ServiceView) {
    for port in &view.ports {
        let protocol = port.protocol.number();
        for (ip, target) in &port.backends {
            if let Some(uses) = backends.get_mut(ip) {
                if let Some(at) = uses.iter().position(|u| *u == (protocol, *target)) {
                    uses.swap_remove(at);
                }
                if uses.is_empty() {
                    backends.remove(ip);
                }
            }
        }
    }
}

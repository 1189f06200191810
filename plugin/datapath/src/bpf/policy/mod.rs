//! NetworkPolicy in the datapath: what the node agent writes for each local
//! pod (its isolation, its allowed peers per direction), the node's own
//! addresses, and what policy dropped. The eBPF side is `ebpf/src/policy/`
//! (its maps in `ebpf/src/maps/policy.rs`).
//!
//! Types here do not depend on the agent: it converts its computed tables
//! (`Entry { cidr, ports }`) into [`PolicyRule`]s.

use std::collections::HashSet;

use flatnet_common::{
    LocalAddrKey, MAP_LOCAL_ADDRS, MAP_POLICY_DROPS, MAP_POLICY_PODS, POLICY_F_EGRESS,
    POLICY_F_INGRESS, PolicyCidrV4, PolicyCidrV6, PolicyDrops, PolicyPod,
};
// The map value; `PolicyPorts` here is the library's own enum.

mod entries;
mod keys;
mod peers;

use std::net::IpAddr;

use aya::maps::PerCpuValues;
use aya::maps::lpm_trie::Key as LpmKey;
use aya::util::nr_cpus;
use flatnet_common::{NO_COUNTER_SLOT, PROG_TO_POD, maps};
use ipnetwork::IpNetwork;

use super::attach::{AttachMode, LinkRole, attach_mode};
use super::typed::{ArrayOf, PerCpuArrayOf, TrieOf};
use super::{Datapath, ignore_missing};
use crate::error::{Error, Result};
use entries::PodEntries;
use keys::{Address, check_slot, policy_network, rule_of};
pub use keys::{local_addr_key, ports_value};
pub use peers::{PeerRule, PolicyTable};

/// Ports `first..=last` of IP protocol `protocol` (6 TCP, 17 UDP, 132 SCTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyPortRange {
    pub protocol: u8,
    pub first: u16,
    pub last: u16,
}

/// What a rule allows to or from its prefix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyPorts {
    /// Every protocol and port (ICMP included).
    Any,
    /// Only these (at most `POLICY_MAX_RANGES`); empty: nothing, an
    /// explicit deny that shadows a shorter prefix (an ipBlock's except).
    Ranges(Vec<PolicyPortRange>),
}

/// One entry of a pod's table for one direction: the peers in `cidr` (the
/// longest prefix holding a peer decides) may use `ports`. A peer in no
/// rule's prefix is denied.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyRule {
    pub cidr: IpNetwork,
    pub ports: PolicyPorts,
}

/// What policy dropped of one pod's traffic (packets; summed over CPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyDropCounts {
    pub ingress_packets: u64,
    pub ingress_bytes: u64,
    pub egress_packets: u64,
    pub egress_bytes: u64,
}

impl Datapath {
    fn policy_pods(&self) -> Result<ArrayOf<maps::POLICY_PODS>> {
        self.array::<maps::POLICY_PODS>()
    }

    fn policy_v4(&self) -> Result<TrieOf<maps::POLICY_V4>> {
        self.lpm_trie::<maps::POLICY_V4>()
    }

    fn policy_v6(&self) -> Result<TrieOf<maps::POLICY_V6>> {
        self.lpm_trie::<maps::POLICY_V6>()
    }

    fn policy_drops_map(&self) -> Result<PerCpuArrayOf<maps::POLICY_DROPS>> {
        self.per_cpu_array::<maps::POLICY_DROPS>()
    }

    /// The counter slot of the local pod with `address` (the index the
    /// policy API takes); None when no local pod has it.
    pub fn slot_of(&self, address: IpAddr) -> Result<Option<u32>> {
        Ok(self
            .endpoint(address)?
            .map(|endpoint| endpoint.counter_slot)
            .filter(|slot| *slot != NO_COUNTER_SLOT))
    }

    /// The policy state of counter slot `slot`: isolation flags and
    /// generation.
    pub fn pod_policy(&self, slot: u32) -> Result<PolicyPod> {
        self.policy_pods()?
            .get(&slot, 0)
            .map_err(|e| Error::bpf("reading a pod's policy", e))
    }

    /// Makes the pod in counter slot `slot` isolated for ingress and/or
    /// egress with these tables (None: that direction is not isolated).
    pub fn set_pod_policy(
        &self,
        slot: u32,
        ingress: Option<&[PolicyRule]>,
        egress: Option<&[PolicyRule]>,
    ) -> Result<()> {
        let table = |rules| PolicyTable { rules, peers: &[] };
        self.set_pod_tables(slot, ingress.map(table), egress.map(table))
    }

    /// [`set_pod_policy`](Self::set_pod_policy) with rules by peer
    /// identity too. The new entries are written first, then the pod's
    /// flags and a new generation (from then on its packets meet the new
    /// tables, and its recorded flows are judged again), then the entries
    /// no longer wanted are deleted: an isolated pod's table is never seen
    /// empty.
    pub fn set_pod_tables(
        &self,
        slot: u32,
        ingress: Option<PolicyTable<'_>>,
        egress: Option<PolicyTable<'_>>,
    ) -> Result<()> {
        self.replace_pod_tables(slot, None, [ingress, egress])
    }

    /// [`set_pod_tables`](Self::set_pod_tables) for a writer that knows
    /// what it wrote for `slot` last (`previous`, ingress and egress): the
    /// entries no longer wanted are deleted by key, without walking every
    /// pod's entries. None: unknown (another writer, a restart), walked.
    pub fn replace_pod_tables(
        &self,
        slot: u32,
        previous: Option<[Option<PolicyTable<'_>>; 2]>,
        [ingress, egress]: [Option<PolicyTable<'_>>; 2],
    ) -> Result<()> {
        check_slot(slot)?;
        // Every value built before anything is written.
        let wanted = PodEntries::of(slot, [ingress, egress])?;
        let previous = previous
            .map(|tables| PodEntries::of(slot, tables))
            .transpose()?;
        let mut by_peer = if self.has_peer_ids() {
            Some(self.policy_peers()?)
        } else if wanted.peers.is_empty() {
            None
        } else {
            return Err(Error::Datapath(
                "the pinned datapath predates policy by peer identity: reload it (flatnet repair)"
                    .into(),
            ));
        };
        let mut v4 = self.policy_v4()?;
        let mut v6 = self.policy_v6()?;
        for (key, value) in &wanted.v4 {
            v4.insert(key, *value, 0)
                .map_err(|e| Error::bpf("writing a policy entry", e))?;
        }
        for (key, value) in &wanted.v6 {
            v6.insert(key, *value, 0)
                .map_err(|e| Error::bpf("writing a policy entry", e))?;
        }
        if let Some(map) = &mut by_peer {
            peers::write_peer_entries(map, &wanted.peers)?;
        }
        let mut flags = 0;
        if ingress.is_some() {
            flags |= POLICY_F_INGRESS;
            // What the host stack delivers into the pod is judged by
            // `to_pod`, at its host veth's egress: on before the flags.
            self.ensure_to_pod(slot)?;
        }
        if egress.is_some() {
            flags |= POLICY_F_EGRESS;
        }
        self.write_pod_policy(slot, flags)?;
        let removed = match previous {
            Some(previous) => {
                let stale = previous.stale(&wanted);
                for (key, _) in &stale.v4 {
                    ignore_missing(v4.remove(key))?;
                }
                for (key, _) in &stale.v6 {
                    ignore_missing(v6.remove(key))?;
                }
                if let Some(map) = &mut by_peer {
                    for (key, _) in &stale.peers {
                        ignore_missing(map.remove(key))?;
                    }
                }
                stale.len()
            }
            None => {
                let (keep_v4, keep_v6) = (wanted.v4_ids(), wanted.v6_ids());
                let mut removed =
                    self.remove_policy_entries(slot, |prefix, direction, address| match address {
                        Address::V4(a) => !keep_v4.contains(&(prefix, direction, a)),
                        Address::V6(a) => !keep_v6.contains(&(prefix, direction, a)),
                    })?;
                if let Some(map) = &mut by_peer {
                    removed += peers::remove_peer_entries(map, slot, &wanted.peers)?;
                }
                removed
            }
        };
        // A packet judged between the new generation and these deletions
        // met the stale entries as well, and its flow was recorded with the
        // new generation: allowed for good by an entry that is gone. One
        // more generation has such flows judged again by the final table.
        if removed > 0 {
            self.write_pod_policy(slot, flags)?;
        }
        Ok(())
    }

    /// Holds the pod in counter slot `slot` closed in `flags`' directions
    /// (`POLICY_F_*`): isolated with empty tables, nothing allowed, its
    /// recorded flows judged again. What a pod gets when its policy cannot
    /// be written (a full map): denying what it allows is loud and safe,
    /// keeping an older table could allow what it denies.
    pub fn hold_pod_closed(&self, slot: u32, flags: u32) -> Result<()> {
        check_slot(slot)?;
        if flags & POLICY_F_INGRESS != 0 {
            self.ensure_to_pod(slot)?;
        }
        self.write_pod_policy(slot, flags)?;
        self.remove_policy_entries(slot, |_, _, _| true)?;
        if self.has_peer_ids() {
            peers::remove_peer_entries(&mut self.policy_peers()?, slot, &[])?;
        }
        self.write_pod_policy(slot, flags)
    }

    /// Has the flows recorded for the pod in counter slot `slot` judged
    /// again (a new generation, its flags kept): a peer it allowed by
    /// identity has left that identity, or the cluster.
    pub fn rejudge_pod_flows(&self, slot: u32) -> Result<()> {
        check_slot(slot)?;
        let current = self.pod_policy(slot)?;
        if current.flags == 0 {
            return Ok(());
        }
        self.write_pod_policy(slot, current.flags)
    }

    /// A new pod's policy before the agent has written its own (see
    /// `network::first_packet`): isolated in `flags`' directions with empty
    /// tables, so nothing passes there from its first packet on; `to_pod`
    /// on its host veth `host_veth` first when ingress is isolated (what
    /// the host stack delivers is judged there). A datapath pinned without
    /// the policy maps has no policy to start.
    pub fn start_pod_policy(&self, slot: u32, host_veth: &str, flags: u32) -> Result<()> {
        if flags == 0 || !self.map_path(MAP_POLICY_PODS).exists() {
            return Ok(());
        }
        check_slot(slot)?;
        if flags & POLICY_F_INGRESS != 0
            && attach_mode() == AttachMode::Tcx
            && !self.link_path(LinkRole::ToPod, host_veth).exists()
        {
            self.attach_tc_link(PROG_TO_POD, LinkRole::ToPod, host_veth)?;
        }
        self.write_pod_policy(slot, flags)
    }

    /// Attaches `to_pod` to the host veth of the pod in `slot` (a pinned tcx
    /// link, `links/egress-<veth>`), unless it is there. Only pods isolated
    /// for ingress get it: the others never pay for it. Creating a tcx link
    /// waits for an RCU grace period (~10 ms here), paid once per pod.
    /// Without tcx (an older kernel) it is not attached: ingress policy then
    /// holds only for what the datapath redirects into the pod.
    fn ensure_to_pod(&self, slot: u32) -> Result<()> {
        if attach_mode() != AttachMode::Tcx {
            return Ok(());
        }
        let ifindex = self.sources(slot)?.host_ifindex;
        let Some(name) = crate::netlink::ifname_of(ifindex) else {
            return Err(Error::Datapath(format!(
                "the pod in counter slot {slot} has no host veth (ifindex {ifindex})"
            )));
        };
        if self.link_path(LinkRole::ToPod, &name).exists() {
            return Ok(());
        }
        self.attach_tc_link(PROG_TO_POD, LinkRole::ToPod, &name)
    }

    /// Makes the pod in counter slot `slot` selected by no policy: flags
    /// first (its packets stop meeting the tables), then its entries. DEL
    /// and GC call it for a pod's slot, which a later pod may reuse. A
    /// datapath pinned without the policy maps has nothing to clear.
    pub fn clear_pod_policy(&self, slot: u32) -> Result<()> {
        if slot == NO_COUNTER_SLOT || !self.map_path(MAP_POLICY_PODS).exists() {
            return Ok(());
        }
        check_slot(slot)?;
        let current = self.pod_policy(slot)?;
        if current.flags != 0 {
            self.write_pod_policy(slot, 0)?;
        }
        self.remove_policy_entries(slot, |_, _, _| true)?;
        if self.has_peer_ids() {
            peers::remove_peer_entries(&mut self.policy_peers()?, slot, &[])?;
        }
        Ok(())
    }

    /// Writes `flags` for `slot` with the next generation: the generation
    /// is never reset (a reused slot's new pod never inherits a flow its
    /// predecessor recorded).
    fn write_pod_policy(&self, slot: u32, flags: u32) -> Result<()> {
        let mut pods = self.policy_pods()?;
        let current = pods
            .get(&slot, 0)
            .map_err(|e| Error::bpf("reading a pod's policy", e))?;
        let value = PolicyPod {
            flags,
            generation: current.generation.wrapping_add(1),
        };
        pods.set(slot, value, 0)
            .map_err(|e| Error::bpf("writing a pod's policy", e))
    }

    /// Removes the policy entries of `slot` that `doomed` selects (prefix
    /// length as keyed, direction, address); how many there were.
    fn remove_policy_entries(
        &self,
        slot: u32,
        doomed: impl Fn(u32, u32, Address) -> bool,
    ) -> Result<usize> {
        let mut v4 = self.policy_v4()?;
        let keys: Vec<LpmKey<PolicyCidrV4>> = v4
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| {
                let data = k.data();
                data.slot == slot
                    && doomed(k.prefix_len(), data.direction, Address::V4(data.address))
            })
            .collect();
        let removed = keys.len();
        for key in keys {
            ignore_missing(v4.remove(&key))?;
        }
        let mut v6 = self.policy_v6()?;
        let keys: Vec<LpmKey<PolicyCidrV6>> = v6
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| {
                let data = k.data();
                data.slot == slot
                    && doomed(k.prefix_len(), data.direction, Address::V6(data.address))
            })
            .collect();
        let removed = removed + keys.len();
        for key in keys {
            ignore_missing(v6.remove(&key))?;
        }
        Ok(removed)
    }

    /// The policy entries of `slot`, as (direction, rule), read back.
    pub fn pod_policy_rules(&self, slot: u32) -> Result<Vec<(u32, PolicyRule)>> {
        let mut rules = Vec::new();
        for entry in self.policy_v4()?.iter() {
            let (key, value) = entry.map_err(|e| Error::bpf("listing policy entries", e))?;
            let data = key.data();
            if data.slot == slot {
                let cidr = policy_network(IpAddr::from(data.address), key.prefix_len())?;
                rules.push((data.direction, rule_of(cidr, &value)));
            }
        }
        for entry in self.policy_v6()?.iter() {
            let (key, value) = entry.map_err(|e| Error::bpf("listing policy entries", e))?;
            let data = key.data();
            if data.slot == slot {
                let cidr = policy_network(IpAddr::from(data.address), key.prefix_len())?;
                rules.push((data.direction, rule_of(cidr, &value)));
            }
        }
        rules.sort();
        Ok(rules)
    }

    /// Makes `LOCAL_ADDRS` hold exactly the node's own `addresses`: traffic
    /// from them into a pod (kubelet's probes) passes any ingress policy.
    pub fn set_local_addresses(&self, addresses: &[IpAddr]) -> Result<()> {
        if addresses.len() > flatnet_common::MAX_LOCAL_ADDRS as usize {
            return Err(Error::Datapath(format!(
                "{} node addresses; {MAP_LOCAL_ADDRS} holds at most {}",
                addresses.len(),
                flatnet_common::MAX_LOCAL_ADDRS
            )));
        }
        let mut map = self.hash_map::<maps::LOCAL_ADDRS>()?;
        let wanted: HashSet<LocalAddrKey> = addresses.iter().map(|a| local_addr_key(*a)).collect();
        for key in &wanted {
            map.insert(key, 0, 0)
                .map_err(|e| Error::bpf("writing a node address", e))?;
        }
        let stale: Vec<LocalAddrKey> = map
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !wanted.contains(k))
            .collect();
        for key in stale {
            ignore_missing(map.remove(&key))?;
        }
        Ok(())
    }

    /// What policy dropped of the pod in counter slot `slot`, summed over
    /// CPUs: (ingress, egress) packets.
    pub fn policy_drops(&self, slot: u32) -> Result<(u64, u64)> {
        let counts = self.policy_drop_counts(slot)?;
        Ok((counts.ingress_packets, counts.egress_packets))
    }

    /// `policy_drops` with bytes.
    pub fn policy_drop_counts(&self, slot: u32) -> Result<PolicyDropCounts> {
        if slot == NO_COUNTER_SLOT {
            return Ok(PolicyDropCounts::default());
        }
        let per_cpu = self
            .policy_drops_map()?
            .get(&slot, 0)
            .map_err(|e| Error::bpf("reading policy drops", e))?;
        Ok(per_cpu
            .iter()
            .fold(PolicyDropCounts::default(), |sum, c| PolicyDropCounts {
                ingress_packets: sum.ingress_packets + c.ingress_packets,
                ingress_bytes: sum.ingress_bytes + c.ingress_bytes,
                egress_packets: sum.egress_packets + c.egress_packets,
                egress_bytes: sum.egress_bytes + c.egress_bytes,
            }))
    }

    /// Zeroes a slot's policy drops (a slot claimed anew).
    pub(super) fn zero_policy_drops(&self, slot: u32) -> Result<()> {
        if !self.map_path(MAP_POLICY_DROPS).exists() {
            return Ok(());
        }
        let cpus = nr_cpus().map_err(|(_, e)| Error::bpf("counting CPUs", e))?;
        let zeros = PerCpuValues::try_from(vec![PolicyDrops::default(); cpus])
            .map_err(|e| Error::bpf("building per-CPU counters", e))?;
        self.policy_drops_map()?
            .set(slot, zeros, 0)
            .map_err(|e| Error::bpf("zeroing a pod's policy drops", e))
    }
}

//! The [`PolicySink`] of a node: the datapath's policy maps.

use std::net::IpAddr;

use flatnet_datapath::bpf::{
    Datapath, PeerRule, PolicyPortRange, PolicyPorts, PolicyRule, PolicyTable,
};

use flatnet_common::{POLICY_F_EGRESS, POLICY_F_INGRESS};
use flatnet_datapath::node::markers::policy_names_file;

use crate::error::{AgentError, Result};
use crate::install::write_atomically;
use crate::policy::{Allowed, PodKey, PodPolicy, PortSet, Table};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Applied, PolicySink};

/// The datapath's policy maps (`flatnet_datapath::bpf`'s policy API): a pod is
/// found by its address (its counter slot), an isolated direction becomes
/// its table, a pod isolated in neither direction is cleared.
pub struct DatapathSink {
    datapath: Datapath,
    /// What `policy_names` wrote last.
    names: Option<BTreeMap<IpAddr, Vec<String>>>,
    /// The tables written last for each counter slot (ingress, egress), so
    /// a rewrite deletes its stale entries by key; a slot not here (after
    /// a restart, a failure, a clear) has its entries walked once.
    written: HashMap<u32, WrittenTables>,
    /// The maps' sizes, as made (they change only when a map is made anew,
    /// from the same configuration).
    capacities: HashMap<String, Option<u32>>,
}

/// One direction's rules by prefix and by identity; None: not isolated.
type WrittenTables = [Option<(Vec<PolicyRule>, Vec<PeerRule>)>; 2];

impl DatapathSink {
    pub fn new(datapath: Datapath) -> Self {
        DatapathSink {
            datapath,
            names: None,
            written: HashMap::new(),
            capacities: HashMap::new(),
        }
    }

    /// The counter slot of the first of `ips` the datapath has.
    fn slot(&self, ips: &[IpAddr]) -> Result<Option<u32>> {
        for ip in ips {
            if let Some(slot) = self.datapath.slot_of(*ip)? {
                return Ok(Some(slot));
            }
        }
        Ok(None)
    }
}

impl PolicySink for DatapathSink {
    fn apply(
        &mut self,
        _pod: &PodKey,
        ips: &[IpAddr],
        policy: Option<&PodPolicy>,
    ) -> Result<Applied> {
        let Some(policy) = policy else {
            let mut slots = BTreeSet::new();
            for ip in ips {
                slots.extend(self.datapath.slot_of(*ip)?);
            }
            for slot in &slots {
                self.written.remove(slot);
                self.datapath.clear_pod_policy(*slot)?;
            }
            return Ok(if slots.is_empty() {
                Applied::Unchanged
            } else {
                Applied::Written
            });
        };
        let Some(slot) = self.slot(&policy.ips)? else {
            return Ok(Applied::NotAttached);
        };
        let wanted: WrittenTables = [&policy.ingress, &policy.egress]
            .map(|allowed| rules(allowed).map(|rules| (rules, peer_rules(allowed))));
        if wanted.iter().all(Option::is_none) {
            // Most pods: never isolated, nothing to clear.
            if self.datapath.pod_policy(slot)?.flags == 0 {
                return Ok(Applied::Unchanged);
            }
            self.written.remove(&slot);
            self.datapath.clear_pod_policy(slot)?;
            return Ok(Applied::Written);
        }
        let previous = self.written.remove(&slot);
        let written = self.datapath.replace_pod_tables(
            slot,
            previous.as_ref().map(as_tables),
            as_tables(&wanted),
        );
        if let Err(error) = written {
            let [ingress, egress] = &wanted;
            // Fail closed: nothing in, nothing out where it is isolated,
            // until a write succeeds.
            let mut flags = 0;
            if ingress.is_some() {
                flags |= POLICY_F_INGRESS;
            }
            if egress.is_some() {
                flags |= POLICY_F_EGRESS;
            }
            if let Err(e) = self.datapath.hold_pod_closed(slot, flags) {
                tracing::error!(slot, error = %e, "cannot hold a pod closed after its policy failed");
            }
            return Err(error.into());
        }
        self.written.insert(slot, wanted);
        Ok(Applied::Written)
    }

    fn capacity(&mut self, name: &str) -> Option<u32> {
        if let Some(known) = self.capacities.get(name) {
            return *known;
        }
        let read = self.datapath.capacity(name).ok().flatten();
        // Not pinned yet: asked again next time.
        if read.is_some() {
            self.capacities.insert(name.to_string(), read);
        }
        read
    }

    fn peer_ids(&mut self) -> Result<BTreeMap<IpAddr, u32>> {
        Ok(self.datapath.peer_ids()?.into_iter().collect())
    }

    fn write_peer_ids(&mut self, addresses: &[(IpAddr, u32)]) -> Result<()> {
        Ok(self.datapath.write_peer_ids(addresses)?)
    }

    fn remove_peer_ids(&mut self, addresses: &[IpAddr]) -> Result<()> {
        Ok(self.datapath.remove_peer_ids(addresses)?)
    }

    fn rejudge(&mut self, ips: &[IpAddr]) -> Result<()> {
        if let Some(slot) = self.slot(ips)? {
            self.datapath.rejudge_pod_flows(slot)?;
        }
        Ok(())
    }

    fn local_addresses(&mut self, addresses: &[IpAddr]) -> Result<()> {
        Ok(self.datapath.set_local_addresses(addresses)?)
    }

    fn in_place(&mut self, policy: &PodPolicy) -> bool {
        let isolated =
            matches!(policy.ingress, Allowed::Only(_)) || matches!(policy.egress, Allowed::Only(_));
        match self.slot(&policy.ips) {
            Ok(Some(slot)) => self
                .datapath
                .pod_policy(slot)
                .is_ok_and(|state| (state.flags != 0) == isolated),
            // Not attached (yet, or any more): nothing to rewrite here.
            _ => true,
        }
    }

    /// `/run/flatnet/policy-<network>.json`, written atomically when it changed.
    fn policy_names(&mut self, names: &BTreeMap<IpAddr, Vec<String>>) -> Result<()> {
        if self.names.as_ref() == Some(names) {
            return Ok(());
        }
        let path = policy_names_file(&self.datapath.network_name());
        let bytes = serde_json::to_vec_pretty(names)
            .map_err(|e| AgentError::io(format!("encoding {}", path.display()), e.into()))?;
        write_atomically(&path, &bytes, 0o644)?;
        self.names = Some(names.clone());
        Ok(())
    }
}

/// An isolated direction's table as the datapath takes it; None: not
/// isolated.
pub fn rules(allowed: &Allowed) -> Option<Vec<PolicyRule>> {
    match allowed {
        Allowed::All => None,
        Allowed::Only(table) => Some(table_rules(table)),
    }
}

/// Tables as the datapath takes them.
fn as_tables(written: &WrittenTables) -> [Option<PolicyTable<'_>>; 2] {
    [&written[0], &written[1]].map(|direction| {
        direction
            .as_ref()
            .map(|(rules, peers)| PolicyTable { rules, peers })
    })
}

/// An isolated direction's rules by peer identity; empty when not
/// isolated.
pub fn peer_rules(allowed: &Allowed) -> Vec<PeerRule> {
    let Allowed::Only(table) = allowed else {
        return Vec::new();
    };
    let peers = table.peers.iter();
    peers
        .map(|(identity, ports)| PeerRule {
            identity: *identity,
            ports: ports_of(ports),
        })
        .collect()
}

fn table_rules(table: &Table) -> Vec<PolicyRule> {
    table
        .entries
        .iter()
        .map(|entry| PolicyRule {
            cidr: entry.cidr,
            ports: ports_of(&entry.ports),
        })
        .collect()
}

fn ports_of(ports: &PortSet) -> PolicyPorts {
    match ports {
        PortSet::Any => PolicyPorts::Any,
        PortSet::Ranges(ranges) => PolicyPorts::Ranges(
            ranges
                .iter()
                .map(|r| PolicyPortRange {
                    protocol: r.protocol.number(),
                    first: r.first,
                    last: r.last,
                })
                .collect(),
        ),
    }
}

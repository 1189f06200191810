//! A pod's tables as the map entries they become: prefix entries per
//! family and peer-identity entries, keyed for its counter slot. Built
//! whole before anything is written; built for the tables written last
//! too, so the stale entries are found by key, not by walking the maps.

use std::collections::HashSet;

use aya::maps::lpm_trie::Key as LpmKey;
use flatnet_common::PolicyPorts as PortsValue;
use flatnet_common::{
    POLICY_DIR_EGRESS, POLICY_DIR_INGRESS, PolicyCidrV4, PolicyCidrV6, PolicyPeerKey,
};
use ipnetwork::IpNetwork;

use super::keys::{key_v4, key_v6, ports_value};
use super::peers::PolicyTable;
use crate::error::Result;

/// The entries of one pod's tables (ingress, egress).
pub(super) struct PodEntries {
    pub v4: Vec<(LpmKey<PolicyCidrV4>, PortsValue)>,
    pub v6: Vec<(LpmKey<PolicyCidrV6>, PortsValue)>,
    pub peers: Vec<(PolicyPeerKey, PortsValue)>,
}

/// A prefix key as compared: (prefix length, direction, address).
type V4Id = (u32, u32, [u8; 4]);
type V6Id = (u32, u32, [u8; 16]);

impl PodEntries {
    /// The entries of `slot` for `tables` (ingress, egress); an error when
    /// a value cannot be built (too many port ranges).
    pub fn of(slot: u32, tables: [Option<PolicyTable<'_>>; 2]) -> Result<Self> {
        let mut entries = PodEntries {
            v4: Vec::new(),
            v6: Vec::new(),
            peers: Vec::new(),
        };
        for (direction, table) in [POLICY_DIR_INGRESS, POLICY_DIR_EGRESS]
            .into_iter()
            .zip(tables)
        {
            let Some(table) = table else { continue };
            for rule in table.rules {
                let cidr = crate::util::normalized(rule.cidr);
                let value = ports_value(&cidr, &rule.ports)?;
                match cidr {
                    IpNetwork::V4(net) => entries.v4.push((key_v4(slot, direction, &net), value)),
                    IpNetwork::V6(net) => entries.v6.push((key_v6(slot, direction, &net), value)),
                }
            }
            for rule in table.peers {
                let what = format!("the pods of identity {}", rule.identity);
                let value = ports_value(&what, &rule.ports)?;
                let key = PolicyPeerKey {
                    slot,
                    direction,
                    identity: rule.identity,
                };
                entries.peers.push((key, value));
            }
        }
        Ok(entries)
    }

    pub fn v4_ids(&self) -> HashSet<V4Id> {
        self.v4.iter().map(|(k, _)| v4_id(k)).collect()
    }

    pub fn v6_ids(&self) -> HashSet<V6Id> {
        self.v6.iter().map(|(k, _)| v6_id(k)).collect()
    }

    /// The entries of `self` (what was written) that `wanted` has not.
    pub fn stale(&self, wanted: &PodEntries) -> PodEntries {
        let (v4, v6) = (wanted.v4_ids(), wanted.v6_ids());
        let peers: HashSet<PolicyPeerKey> = wanted.peers.iter().map(|(k, _)| *k).collect();
        PodEntries {
            v4: self
                .v4
                .iter()
                .filter(|(k, _)| !v4.contains(&v4_id(k)))
                .cloned()
                .collect(),
            v6: self
                .v6
                .iter()
                .filter(|(k, _)| !v6.contains(&v6_id(k)))
                .cloned()
                .collect(),
            peers: self
                .peers
                .iter()
                .filter(|(k, _)| !peers.contains(k))
                .cloned()
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len() + self.peers.len()
    }
}

pub(super) fn v4_id(key: &LpmKey<PolicyCidrV4>) -> V4Id {
    (key.prefix_len(), key.data().direction, key.data().address)
}

pub(super) fn v6_id(key: &LpmKey<PolicyCidrV6>) -> V6Id {
    (key.prefix_len(), key.data().direction, key.data().address)
}

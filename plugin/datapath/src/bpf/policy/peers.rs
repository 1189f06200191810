//! Policy by peer identity: the identity of each peer address a local
//! pod's policy names (`PEER_IDS_V4`/`PEER_IDS_V6`), and what each pod
//! allows each identity (`POLICY_PEERS`). A pod coming or going elsewhere
//! in the cluster changes one address entry here, not every table that
//! allows it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use flatnet_common::PolicyPorts as PortsValue;
use flatnet_common::{MAP_PEER_IDS_V4, MAP_POLICY_PEERS, PolicyPeerKey, maps};

use super::super::typed::HashOf;
use super::super::{Datapath, ignore_missing};
use super::{PolicyPorts, PolicyRule};
use crate::error::{Error, Result};

/// What a pod allows the peers of identity `identity`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerRule {
    pub identity: u32,
    pub ports: PolicyPorts,
}

/// One direction of a pod's policy: by prefix and by peer identity. A
/// peer is allowed what the longest prefix holding its address allows,
/// together with what its identity is allowed.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyTable<'a> {
    pub rules: &'a [PolicyRule],
    pub peers: &'a [PeerRule],
}

impl Datapath {
    fn peer_ids_v4(&self) -> Result<HashOf<maps::PEER_IDS_V4>> {
        self.hash_map::<maps::PEER_IDS_V4>()
    }

    fn peer_ids_v6(&self) -> Result<HashOf<maps::PEER_IDS_V6>> {
        self.hash_map::<maps::PEER_IDS_V6>()
    }

    pub(super) fn policy_peers(&self) -> Result<HashOf<maps::POLICY_PEERS>> {
        self.hash_map::<maps::POLICY_PEERS>()
    }

    /// Whether this datapath has the maps of policy by identity (one
    /// pinned by a build before them has not, until it is reloaded).
    pub fn has_peer_ids(&self) -> bool {
        self.map_path(MAP_PEER_IDS_V4).exists() && self.map_path(MAP_POLICY_PEERS).exists()
    }

    /// Every peer address's identity, as the maps hold them.
    pub fn peer_ids(&self) -> Result<HashMap<IpAddr, u32>> {
        let mut ids = HashMap::new();
        if !self.has_peer_ids() {
            return Ok(ids);
        }
        for entry in self.peer_ids_v4()?.iter() {
            let (address, id) = entry.map_err(|e| Error::bpf("listing peer identities", e))?;
            ids.insert(IpAddr::from(address), id);
        }
        for entry in self.peer_ids_v6()?.iter() {
            let (address, id) = entry.map_err(|e| Error::bpf("listing peer identities", e))?;
            ids.insert(IpAddr::from(address), id);
        }
        Ok(ids)
    }

    /// Gives each address its identity (a new entry, or a changed one).
    pub fn write_peer_ids(&self, entries: &[(IpAddr, u32)]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let (mut v4, mut v6) = (self.peer_ids_v4()?, self.peer_ids_v6()?);
        for (address, id) in entries {
            let written = match address {
                IpAddr::V4(a) => v4.insert(a.octets(), *id, 0),
                IpAddr::V6(a) => v6.insert(a.octets(), *id, 0),
            };
            written.map_err(|e| Error::bpf(format!("writing the identity of {address}"), e))?;
        }
        Ok(())
    }

    /// Takes these addresses' identities away.
    pub fn remove_peer_ids(&self, addresses: &[IpAddr]) -> Result<()> {
        if addresses.is_empty() {
            return Ok(());
        }
        let (mut v4, mut v6) = (self.peer_ids_v4()?, self.peer_ids_v6()?);
        for address in addresses {
            ignore_missing(match address {
                IpAddr::V4(a) => v4.remove(&a.octets()),
                IpAddr::V6(a) => v6.remove(&a.octets()),
            })?;
        }
        Ok(())
    }

    /// What `slot` allows each identity, read back: (direction, rule).
    pub fn pod_policy_peers(&self, slot: u32) -> Result<Vec<(u32, PeerRule)>> {
        let mut rules = Vec::new();
        if !self.has_peer_ids() {
            return Ok(rules);
        }
        for entry in self.policy_peers()?.iter() {
            let (key, value) = entry.map_err(|e| Error::bpf("listing policy entries", e))?;
            if key.slot == slot {
                let ports = super::keys::ports_of(&value);
                let identity = key.identity;
                rules.push((key.direction, PeerRule { identity, ports }));
            }
        }
        rules.sort();
        Ok(rules)
    }
}

pub(super) fn write_peer_entries(
    map: &mut HashOf<maps::POLICY_PEERS>,
    entries: &[(PolicyPeerKey, PortsValue)],
) -> Result<()> {
    for (key, value) in entries {
        map.insert(key, *value, 0)
            .map_err(|e| Error::bpf("writing a policy entry", e))?;
    }
    Ok(())
}

/// Removes the entries of `slot` not in `keep`; how many there were.
pub(super) fn remove_peer_entries(
    map: &mut HashOf<maps::POLICY_PEERS>,
    slot: u32,
    keep: &[(PolicyPeerKey, PortsValue)],
) -> Result<usize> {
    let keep: HashSet<PolicyPeerKey> = keep.iter().map(|(k, _)| *k).collect();
    let doomed: Vec<PolicyPeerKey> = map
        .keys()
        .filter_map(|k| k.ok())
        .filter(|k| k.slot == slot && !keep.contains(k))
        .collect();
    for key in &doomed {
        ignore_missing(map.remove(key))?;
    }
    Ok(doomed.len())
}

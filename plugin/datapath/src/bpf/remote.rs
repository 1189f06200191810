//! Other nodes' pod CIDRs (the LPM tries the agent keeps) and the node's
//! VXLAN device (`TUNNEL`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use aya::maps::lpm_trie::Key as LpmKey;
use flatnet_common::{
    MAP_PEER_NODES_V4, MAP_PEER_NODES_V6, MAP_REMOTE_CIDRS_V4, MAP_REMOTE_CIDRS_V6, MAP_TUNNEL,
    REMOTE_F_TUNNEL, RemoteCidrV4, RemoteCidrV6, RemoteNode, TunnelConfig, maps,
};
use ipnetwork::IpNetwork;

use super::typed::{ArrayOf, HashOf, TrieOf};
use super::{Datapath, ignore_missing};
use crate::error::{Error, Result};

/// `AF_INET`/`AF_INET6` as `RemoteNode::family` holds them.
pub(super) const FAMILY_INET: u32 = libc::AF_INET as u32;

pub(super) const FAMILY_INET6: u32 = libc::AF_INET6 as u32;

/// What the remote-CIDR tries held when the agent last wrote them, and
/// which maps those were (kernel ids).
#[derive(Clone, Debug, Default)]
pub struct RemoteWritten {
    maps: [u32; 4],
    entries: HashSet<RemoteCidr>,
    peer_nodes: BTreeSet<IpAddr>,
}

impl RemoteWritten {
    pub fn cidrs(&self) -> impl Iterator<Item = IpNetwork> + '_ {
        self.entries.iter().map(|e| e.cidr)
    }

    /// Forgets `cidrs` (taken out of the tries).
    pub fn forget(&mut self, cidrs: &[IpNetwork]) {
        let cidrs: HashSet<&IpNetwork> = cidrs.iter().collect();
        self.entries.retain(|e| !cidrs.contains(&e.cidr));
    }
}

/// One entry of the remote-CIDR tries: a pod CIDR, the node it is on, and
/// whether that node is reached through the VXLAN tunnel (`node` is then
/// the tunnel's far end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteCidr {
    pub cidr: IpNetwork,
    pub node: IpAddr,
    pub tunnelled: bool,
}

impl Datapath {
    pub(super) fn remote_v4(&self) -> Result<TrieOf<maps::REMOTE_CIDRS_V4>> {
        self.lpm_trie::<maps::REMOTE_CIDRS_V4>()
    }

    pub(super) fn remote_v6(&self) -> Result<TrieOf<maps::REMOTE_CIDRS_V6>> {
        self.lpm_trie::<maps::REMOTE_CIDRS_V6>()
    }

    /// Other nodes' pod CIDRs the fast path knows.
    pub fn remote_cidrs(&self) -> Result<Vec<RemoteCidr>> {
        let mut found = Vec::new();
        for entry in self.remote_v4()?.iter() {
            let (key, node) = entry.map_err(|e| Error::bpf("listing remote CIDRs", e))?;
            found.push(remote_cidr(
                remote_network(key.prefix_len(), &key.data())?,
                &node,
            ));
        }
        for entry in self.remote_v6()?.iter() {
            let (key, node) = entry.map_err(|e| Error::bpf("listing remote CIDRs", e))?;
            found.push(remote_cidr(
                remote_network(key.prefix_len(), &key.data())?,
                &node,
            ));
        }
        Ok(found)
    }

    /// Makes the remote-CIDR tries hold exactly `wanted`, reading them
    /// back first (see [`Datapath::sync_remote_cidrs`]).
    pub fn set_remote_cidrs(&self, wanted: &[RemoteCidr]) -> Result<()> {
        self.sync_remote_cidrs(wanted, None).map(drop)
    }

    /// Makes the remote-CIDR tries hold exactly `wanted`: new and changed
    /// entries first, then the ones no longer wanted, so a CIDR that stays
    /// never misses a packet; entries already right are not written again.
    /// What they hold now is `known` when that is still about the same maps
    /// (a reloaded datapath's have other ids), else read back: at 5,000
    /// peers the read is 10,000 system calls, and the agent calls this at
    /// every pass. Returns what they hold after.
    pub fn sync_remote_cidrs(
        &self,
        wanted: &[RemoteCidr],
        known: Option<RemoteWritten>,
    ) -> Result<RemoteWritten> {
        let maps = self.remote_map_ids()?;
        let current = match known {
            Some(known) if known.maps == maps => known,
            _ => self.read_remote()?,
        };
        let wanted: HashMap<IpNetwork, RemoteCidr> = wanted
            .iter()
            .map(|entry| {
                let cidr = crate::util::normalized(entry.cidr);
                (cidr, RemoteCidr { cidr, ..*entry })
            })
            .collect();
        let mut v4 = self.remote_v4()?;
        let mut v6 = self.remote_v6()?;
        for (cidr, entry) in &wanted {
            if current.entries.contains(entry) {
                continue;
            }
            let value = remote_node(entry.node, entry.tunnelled);
            match cidr {
                IpNetwork::V4(net) => v4.insert(&remote_key_v4(net), value, 0),
                IpNetwork::V6(net) => v6.insert(&remote_key_v6(net), value, 0),
            }
            .map_err(|e| Error::bpf(format!("inserting remote CIDR {cidr}"), e))?;
        }
        let gone: Vec<IpNetwork> = current
            .entries
            .iter()
            .map(|e| e.cidr)
            .filter(|cidr| !wanted.contains_key(cidr))
            .collect();
        self.remove_remote_cidrs(&gone)?;
        let peer_nodes: BTreeSet<IpAddr> = wanted
            .values()
            .filter(|entry| !entry.tunnelled)
            .map(|entry| entry.node)
            .collect();
        self.set_peer_nodes(&peer_nodes, &current.peer_nodes)?;
        Ok(RemoteWritten {
            maps,
            entries: wanted.into_values().collect(),
            peer_nodes,
        })
    }

    /// What the remote-CIDR tries and peer-node maps hold now, read back.
    pub fn read_remote(&self) -> Result<RemoteWritten> {
        Ok(RemoteWritten {
            maps: self.remote_map_ids()?,
            entries: self.remote_cidrs()?.into_iter().collect(),
            peer_nodes: self.peer_nodes()?,
        })
    }

    /// The kernel's ids of the remote-CIDR tries and peer-node maps (0 for
    /// one not pinned): they change when the datapath is loaded anew.
    fn remote_map_ids(&self) -> Result<[u32; 4]> {
        let mut ids = [0; 4];
        let names = [
            MAP_REMOTE_CIDRS_V4,
            MAP_REMOTE_CIDRS_V6,
            MAP_PEER_NODES_V4,
            MAP_PEER_NODES_V6,
        ];
        for (id, name) in ids.iter_mut().zip(names) {
            if let Some(info) = self.pinned_map_info(name)? {
                *id = info.id();
            }
        }
        Ok(ids)
    }

    /// Takes `cidrs` out of the remote-CIDR tries (the ones not there are
    /// no error).
    pub fn remove_remote_cidrs(&self, cidrs: &[IpNetwork]) -> Result<()> {
        if cidrs.is_empty() {
            return Ok(());
        }
        let (mut v4, mut v6) = (self.remote_v4()?, self.remote_v6()?);
        for cidr in cidrs {
            ignore_missing(match crate::util::normalized(*cidr) {
                IpNetwork::V4(net) => v4.remove(&remote_key_v4(&net)),
                IpNetwork::V6(net) => v6.remove(&remote_key_v6(&net)),
            })?;
        }
        Ok(())
    }

    fn peer_nodes_v4(&self) -> Result<HashOf<maps::PEER_NODES_V4>> {
        self.hash_map::<maps::PEER_NODES_V4>()
    }

    fn peer_nodes_v6(&self) -> Result<HashOf<maps::PEER_NODES_V6>> {
        self.hash_map::<maps::PEER_NODES_V6>()
    }

    /// The other nodes' addresses whose TCP flows to local pods take the
    /// fast path both ways (`PEER_NODES_*`): the directly routed nodes of
    /// the remote-CIDR tries.
    pub fn peer_nodes(&self) -> Result<BTreeSet<IpAddr>> {
        let mut found = BTreeSet::new();
        if !self.peer_nodes_pinned() {
            return Ok(found);
        }
        for key in self.peer_nodes_v4()?.keys() {
            let key = key.map_err(|e| Error::bpf("listing peer nodes", e))?;
            found.insert(IpAddr::from(key));
        }
        for key in self.peer_nodes_v6()?.keys() {
            let key = key.map_err(|e| Error::bpf("listing peer nodes", e))?;
            found.insert(IpAddr::from(key));
        }
        Ok(found)
    }

    /// Whether this network's pins have `PEER_NODES_*` (an older build's
    /// have not: its programs take no TCP from other nodes' addresses).
    fn peer_nodes_pinned(&self) -> bool {
        [MAP_PEER_NODES_V4, MAP_PEER_NODES_V6]
            .iter()
            .all(|name| self.map_path(name).exists())
    }

    /// Makes `PEER_NODES_*` hold exactly `wanted`, new addresses first;
    /// they hold `current` now.
    fn set_peer_nodes(&self, wanted: &BTreeSet<IpAddr>, current: &BTreeSet<IpAddr>) -> Result<()> {
        if !self.peer_nodes_pinned() {
            return Ok(());
        }
        let mut v4 = self.peer_nodes_v4()?;
        let mut v6 = self.peer_nodes_v6()?;
        for address in wanted.difference(current) {
            match address {
                IpAddr::V4(ip) => v4.insert(ip.octets(), 1, 0),
                IpAddr::V6(ip) => v6.insert(ip.octets(), 1, 0),
            }
            .map_err(|e| Error::bpf(format!("inserting peer node {address}"), e))?;
        }
        for address in current.difference(wanted) {
            ignore_missing(match address {
                IpAddr::V4(ip) => v4.remove(&ip.octets()),
                IpAddr::V6(ip) => v6.remove(&ip.octets()),
            })?;
        }
        Ok(())
    }

    /// The node's VXLAN device as the datapath knows it (None: no device,
    /// tunnelled CIDRs take the stack's routes).
    pub fn tunnel(&self) -> Result<Option<TunnelConfig>> {
        let config = self
            .tunnel_map()?
            .get(&0, 0)
            .map_err(|e| Error::bpf(format!("reading {MAP_TUNNEL}"), e))?;
        Ok((config.ifindex != 0).then_some(config))
    }

    /// Points the fast path at the node's VXLAN device, or (None) at none.
    pub fn set_tunnel(&self, config: Option<TunnelConfig>) -> Result<()> {
        let config = config.unwrap_or_default();
        if self.tunnel()?.unwrap_or_default() == config {
            return Ok(());
        }
        self.tunnel_map()?
            .set(0, config, 0)
            .map_err(|e| Error::bpf(format!("writing {MAP_TUNNEL}"), e))
    }

    fn tunnel_map(&self) -> Result<ArrayOf<maps::TUNNEL>> {
        self.array::<maps::TUNNEL>()
    }
}

/// The CIDR an LPM key stands for.
pub(super) fn remote_network(prefix_len: u32, data: &[u8]) -> Result<IpNetwork> {
    let ip = match data.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(data).unwrap_or_default()),
        _ => IpAddr::from(<[u8; 16]>::try_from(data).unwrap_or_default()),
    };
    let prefix = u8::try_from(prefix_len).unwrap_or(u8::MAX);
    IpNetwork::new(ip, prefix)
        .map_err(|e| Error::Datapath(format!("a remote CIDR key is malformed: {e}")))
}

pub(super) fn remote_key_v4(net: &ipnetwork::Ipv4Network) -> LpmKey<RemoteCidrV4> {
    LpmKey::new(u32::from(net.prefix()), net.network().octets())
}

pub(super) fn remote_key_v6(net: &ipnetwork::Ipv6Network) -> LpmKey<RemoteCidrV6> {
    LpmKey::new(u32::from(net.prefix()), net.network().octets())
}

pub(super) fn remote_node(address: IpAddr, tunnelled: bool) -> RemoteNode {
    let mut value = RemoteNode {
        flags: if tunnelled { REMOTE_F_TUNNEL } else { 0 },
        ..RemoteNode::default()
    };
    match address {
        IpAddr::V4(v4) => {
            value.node_address[..4].copy_from_slice(&v4.octets());
            value.family = FAMILY_INET;
        }
        IpAddr::V6(v6) => {
            value.node_address = v6.octets();
            value.family = FAMILY_INET6;
        }
    }
    value
}

fn remote_cidr(cidr: IpNetwork, node: &RemoteNode) -> RemoteCidr {
    RemoteCidr {
        cidr,
        node: node_address(node),
        tunnelled: node.flags & REMOTE_F_TUNNEL != 0,
    }
}

pub(super) fn node_address(node: &RemoteNode) -> IpAddr {
    if node.family == FAMILY_INET6 {
        IpAddr::from(node.node_address)
    } else {
        let mut v4 = [0u8; 4];
        v4.copy_from_slice(&node.node_address[..4]);
        IpAddr::from(v4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_keys_and_values_round_trip() {
        let net: IpNetwork = "10.244.3.0/24".parse().unwrap();
        assert_eq!(remote_network(24, &[10, 244, 3, 0]).unwrap(), net);
        let v6: IpNetwork = "fd00:10::/64".parse().unwrap();
        let IpNetwork::V6(inner) = v6 else {
            unreachable!()
        };
        assert_eq!(remote_network(64, &inner.network().octets()).unwrap(), v6);
        assert!(remote_network(33, &[10, 0, 0, 0]).is_err());
        for address in ["172.31.0.2", "fd00::2"] {
            let ip: IpAddr = address.parse().unwrap();
            assert_eq!(node_address(&remote_node(ip, false)), ip);
            let tunnelled = remote_node(ip, true);
            assert_eq!(tunnelled.flags, REMOTE_F_TUNNEL);
            assert!(remote_cidr("10.1.0.0/16".parse().unwrap(), &tunnelled).tunnelled);
        }
        assert_eq!(
            crate::util::normalized("10.1.2.3/16".parse().unwrap()),
            "10.1.0.0/16".parse::<IpNetwork>().unwrap()
        );
    }
}

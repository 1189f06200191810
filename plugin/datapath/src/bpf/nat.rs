//! NodePort, externalIPs and load-balancer IPs for clients outside the
//! node: the ports their frontends listen on (`EXTERNAL_PORTS`), and the
//! uplink program's per-flow translations (`NAT_FORWARD`, `NAT_REVERSE`),
//! which the agent collects when idle.

use std::net::SocketAddr;

use flatnet_common::{
    MAP_EXTERNAL_PORTS, MAP_NAT_FORWARD, MAP_NAT_LOCAL_SOURCES, MAP_NAT_REVERSE, NAT_F_CLOSING,
    NAT_F_LOCAL_SOURCE, NatKey, NatReverse, external_port,
};

use super::services::address_of;
use flatnet_common::maps;

use super::typed::{ArrayOf, HashOf};
use super::{Datapath, ignore_missing};
use crate::error::{Error, Result};

/// One translated flow, as `flatnet inspect` and the collector see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatFlow {
    pub protocol: u8,
    pub client: SocketAddr,
    pub frontend: SocketAddr,
    pub backend: SocketAddr,
    /// The node port the client's source became (None: the client's
    /// address kept).
    pub nat_port: Option<u16>,
    /// A TCP FIN or RST passed.
    pub closing: bool,
    /// When a packet last passed, either way (monotonic ns).
    pub last_ns: u64,
    forward_key: NatKey,
    reverse_key: NatKey,
}

/// A way back (`NAT_REVERSE` entry) no flow's forward entry leads to: its
/// client reopened the tuple (a new flow took over, the old way back left
/// spent for a new flow's taking), or the LRU forgot the forward entry
/// first. Of no use to anyone: collected once idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanReply {
    pub protocol: u8,
    /// A TCP FIN or RST passed.
    pub closing: bool,
    /// When a reply last passed (monotonic ns).
    pub last_ns: u64,
    key: NatKey,
}

/// The ways back among `replies` that no forward entry leads to
/// (`leading`: the reverse keys the forward entries name).
pub fn orphan_replies(
    leading: &std::collections::HashSet<NatKey>,
    replies: impl IntoIterator<Item = (NatKey, NatReverse)>,
) -> Vec<OrphanReply> {
    replies
        .into_iter()
        .filter(|(key, _)| !leading.contains(key))
        .map(|(key, reply)| OrphanReply {
            protocol: key.protocol,
            closing: reply.flags & NAT_F_CLOSING != 0,
            last_ns: reply.last_ns,
            key,
        })
        .collect()
}

fn socket(address: &[u8; 16], port: [u8; 2], family: u8) -> SocketAddr {
    SocketAddr::new(address_of(address, family), u16::from_be_bytes(port))
}

impl Datapath {
    fn external_ports(&self) -> Result<ArrayOf<maps::EXTERNAL_PORTS>> {
        self.array::<maps::EXTERNAL_PORTS>()
    }

    fn nat_forward(&self) -> Result<HashOf<maps::NAT_FORWARD>> {
        self.hash_map::<maps::NAT_FORWARD>()
    }

    fn nat_reverse(&self) -> Result<HashOf<maps::NAT_REVERSE>> {
        self.hash_map::<maps::NAT_REVERSE>()
    }

    /// Every port with frontends outside clients reach, and its
    /// `external_port` bits (none when the maps are not pinned).
    pub fn external_port_bits(&self) -> Result<Vec<(u16, u32)>> {
        if !self.map_path(MAP_EXTERNAL_PORTS).exists() {
            return Ok(Vec::new());
        }
        let ports = self.external_ports()?;
        let mut listening = Vec::new();
        for port in 0..=u16::MAX {
            let bits = ports
                .get(&u32::from(port), 0)
                .map_err(|e| Error::bpf(format!("reading {MAP_EXTERNAL_PORTS}"), e))?;
            if bits != 0 {
                listening.push((port, bits));
            }
        }
        Ok(listening)
    }

    /// Sets the Services' `external_port` bits of `port` (0: no Service
    /// listens there), keeping its hostPorts'.
    pub fn set_external_port(&self, port: u16, bits: u32) -> Result<()> {
        let _lock = self.host_port_lock()?;
        self.set_port_half(port, bits, external_port::SERVICE_BITS)
    }

    /// Replaces the `half` bits of `port`'s entry with `bits`; the caller
    /// holds the lock the entry's other writer takes too.
    pub(super) fn set_port_half(&self, port: u16, bits: u32, half: u32) -> Result<()> {
        let mut ports = self.external_ports()?;
        let entry = ports
            .get(&u32::from(port), 0)
            .map_err(|e| Error::bpf(format!("reading {MAP_EXTERNAL_PORTS}"), e))?;
        ports
            .set(u32::from(port), (entry & !half) | (bits & half), 0)
            .map_err(|e| Error::bpf(format!("writing {MAP_EXTERNAL_PORTS}"), e))
    }

    /// Every flow the uplink program translated, with its last use taken
    /// from both directions.
    pub fn nat_flows(&self) -> Result<Vec<NatFlow>> {
        if !self.map_path(MAP_NAT_FORWARD).exists() {
            return Ok(Vec::new());
        }
        let reverse = self.nat_reverse()?;
        let local_sources = self.nat_local_sources()?;
        let mut flows = Vec::new();
        for entry in self.nat_forward()?.iter() {
            let (key, forward) =
                entry.map_err(|e| Error::bpf(format!("reading {MAP_NAT_FORWARD}"), e))?;
            let reverse_key = NatKey {
                src: forward.backend,
                dst: if forward.nat_port == [0; 2] {
                    key.src
                } else if forward.flags & NAT_F_LOCAL_SOURCE != 0 {
                    local_sources[usize::from(key.family != 4)]
                } else {
                    key.dst
                },
                src_port: forward.backend_port,
                dst_port: if forward.nat_port == [0; 2] {
                    key.src_port
                } else {
                    forward.nat_port
                },
                protocol: key.protocol,
                family: key.family,
                _pad: [0; 2],
            };
            let back = reverse.get(&reverse_key, 0).ok();
            let (back_ns, back_flags) = back.map_or((0, 0), |r| (r.last_ns, r.flags));
            flows.push(NatFlow {
                protocol: key.protocol,
                client: socket(&key.src, key.src_port, key.family),
                frontend: socket(&key.dst, key.dst_port, key.family),
                backend: socket(&forward.backend, forward.backend_port, key.family),
                nat_port: (forward.nat_port != [0; 2])
                    .then(|| u16::from_be_bytes(forward.nat_port)),
                closing: (forward.flags | back_flags) & NAT_F_CLOSING != 0,
                last_ns: forward.last_ns.max(back_ns),
                forward_key: key,
                reverse_key,
            });
        }
        Ok(flows)
    }

    /// The sources flows to local backends were given, per family
    /// (`NAT_LOCAL_SOURCES`; all zero where an older build's pins lack it).
    fn nat_local_sources(&self) -> Result<[[u8; 16]; 2]> {
        if !self.map_path(MAP_NAT_LOCAL_SOURCES).exists() {
            return Ok([[0; 16]; 2]);
        }
        let sources = self.array::<maps::NAT_LOCAL_SOURCES>()?;
        let mut found = [[0; 16]; 2];
        for (index, slot) in found.iter_mut().enumerate() {
            *slot = sources
                .get(&(index as u32), 0)
                .map_err(|e| Error::bpf(format!("reading {MAP_NAT_LOCAL_SOURCES}"), e))?;
        }
        Ok(found)
    }

    /// The ways back no flow of `flows` (what `nat_flows` read just
    /// before) leads to (`OrphanReply`). A new flow's way back is written
    /// just before its forward entry, and one may have come since `flows`
    /// was read: the caller forgets only idle ones.
    pub fn orphan_nat_replies(&self, flows: &[NatFlow]) -> Result<Vec<OrphanReply>> {
        if !self.map_path(MAP_NAT_REVERSE).exists() {
            return Ok(Vec::new());
        }
        let leading = flows.iter().map(|flow| flow.reverse_key).collect();
        let mut replies = Vec::new();
        for entry in self.nat_reverse()?.iter() {
            replies.push(entry.map_err(|e| Error::bpf(format!("reading {MAP_NAT_REVERSE}"), e))?);
        }
        Ok(orphan_replies(&leading, replies))
    }

    /// Forgets a way back no flow leads to.
    pub fn forget_orphan_nat_reply(&self, orphan: &OrphanReply) -> Result<()> {
        ignore_missing(self.nat_reverse()?.remove(&orphan.key))
    }

    /// Forgets a translated flow, both ways.
    pub fn forget_nat_flow(&self, flow: &NatFlow) -> Result<()> {
        ignore_missing(self.nat_forward()?.remove(&flow.forward_key))?;
        ignore_missing(self.nat_reverse()?.remove(&flow.reverse_key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> NatKey {
        NatKey {
            dst_port: port.to_be_bytes(),
            protocol: 6,
            family: 4,
            ..Default::default()
        }
    }

    #[test]
    fn only_ways_back_no_flow_leads_to_are_orphans() {
        let leading = [key(61000)].into_iter().collect();
        let closed = NatReverse {
            flags: NAT_F_CLOSING | flatnet_common::NAT_F_RESET,
            last_ns: 7,
            ..Default::default()
        };
        let orphans = orphan_replies(
            &leading,
            [(key(61000), NatReverse::default()), (key(61001), closed)],
        );
        assert_eq!(
            orphans,
            [OrphanReply {
                protocol: 6,
                closing: true,
                last_ns: 7,
                key: key(61001),
            }]
        );
        assert!(orphan_replies(&leading, [(key(61000), closed)]).is_empty());
    }
}

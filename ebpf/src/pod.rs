//! A frame from a pod, step by step: its source checked against the pod's
//! own addresses, its destination looked up (another local pod, another
//! node's pod, or the host stack's), and the fast path taken unless the
//! host tracks the flow (`flow`).

use aya_ebpf::btf_maps::lpm_trie::Key;
use flatnet_common::{
    ENDPOINT_F_SHAPED_INGRESS, Endpoint, NO_COUNTER_SLOT, PodSources, REMOTE_F_TUNNEL, RemoteNode,
    SOURCES_F_MORE, SOURCES_F_VALID, SOURCES_PER_FAMILY,
};
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::decision::Decision;
use crate::flow;
use crate::flow::{Conntrack, Flow};
use crate::maps::endpoints::{ENDPOINTS_V4, ENDPOINTS_V6, POD_SOURCES};
use crate::maps::remote::{PEER_NODES_V4, PEER_NODES_V6, REMOTE_CIDRS_V4, REMOTE_CIDRS_V6};
use crate::neighbours::{ND_NEIGHBOR_SOLICIT, NeighbourMessage, arp, neighbour_solicitation};
use crate::packet::{header_at, snapshot};
use crate::proto::{
    ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, IPPROTO_ICMPV6, IPPROTO_TCP, is_link_local, is_multicast,
};
use crate::sender::Sender;

#[inline(always)]
pub(crate) fn frame(ct: &impl Conntrack, start: usize, end: usize, sender: Sender) -> Decision {
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return Decision::Pass;
    };
    // SAFETY: `header_at` checked the header lies inside the packet.
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => ipv4(ct, start, end, eth, sender),
        ETH_P_IPV6 => ipv6(ct, start, end, eth, sender),
        ETH_P_ARP => arp(start, end, eth, sender.ifindex).unwrap_or(Decision::Pass),
        _ => Decision::Pass,
    }
}

/// What the sender's `POD_SOURCES` entry says of a source address.
pub(crate) enum Owned {
    Yes,
    No,
    /// No entry (an older build's pod) or not all addresses in it.
    Unknown,
}

/// Looks `address` up among the sender's own addresses (`pick` chooses
/// the family's list in its entry). Field by field, in place: a copy of the
/// whole entry would not fit the program's stack.
#[inline(always)]
pub(crate) fn owned_by<const N: usize>(
    sender: Sender,
    address: &[u8; N],
    pick: impl Fn(*const PodSources) -> *const [[u8; N]; SOURCES_PER_FAMILY],
) -> Owned {
    if sender.slot == NO_COUNTER_SLOT {
        return Owned::Unknown;
    }
    let Some(entry) = POD_SOURCES.get_ptr(sender.slot) else {
        return Owned::Unknown;
    };
    // SAFETY: a valid map value for the program's run.
    let flags = unsafe { core::ptr::read_volatile(&(*entry).flags) };
    if flags & SOURCES_F_VALID == 0 {
        return Owned::Unknown;
    }
    let list = pick(entry);
    for i in 0..SOURCES_PER_FAMILY {
        // SAFETY: an element of the entry's array, read once.
        let own = unsafe { core::ptr::read_volatile(&(*list)[i]) };
        if own == *address {
            return Owned::Yes;
        }
    }
    if flags & SOURCES_F_MORE != 0 {
        Owned::Unknown
    } else {
        Owned::No
    }
}

/// Where a pod's packet is for, as the fast path sees it: another local
/// pod (`peer`), or a pod on another node (`peer` all zero). A struct, not
/// an enum with data: LLVM may spill an enum's unset payload from a
/// register the verifier knows to be uninitialised, and it refuses that.
pub(crate) struct Target {
    local: bool,
    /// A remote pod reached through the VXLAN device (`REMOTE_F_TUNNEL`).
    tunnel: bool,
    /// Not a pod: a directly routed node's own address (`PEER_NODES_*`),
    /// the packet a continuing TCP segment.
    peer_node: bool,
    peer: Endpoint,
}

impl Target {
    #[inline(always)]
    fn pod(peer: Endpoint) -> Self {
        Target {
            local: true,
            tunnel: false,
            peer_node: false,
            peer,
        }
    }

    #[inline(always)]
    fn remote(node: &RemoteNode) -> Self {
        // SAFETY: a valid map value for the program's run; one field read once.
        let flags = unsafe { core::ptr::read_volatile(&node.flags) };
        Target {
            local: false,
            tunnel: flags & REMOTE_F_TUNNEL != 0,
            peer_node: false,
            peer: Endpoint::default(),
        }
    }

    /// A directly routed node's own address, for a TCP segment that
    /// continues a connection: a reply in a flow that node opened, which
    /// `from_uplink` took past the stack (`uplink_to_pod`), or one the
    /// stack tracks (judged so by `flow`).
    #[inline(always)]
    fn peer_node() -> Self {
        Target {
            local: false,
            tunnel: false,
            peer_node: true,
            peer: Endpoint::default(),
        }
    }
}

/// A pod's IPv4 packet: dropped unless it comes from one of the pod's own
/// addresses; to another pod on the fast path unless the host stack tracks
/// its flow.
#[inline(always)]
pub(crate) fn ipv4(
    ct: &impl Conntrack,
    start: usize,
    end: usize,
    eth: *mut EthHdr,
    sender: Sender,
) -> Decision {
    let ingress = sender.ifindex;
    let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
        return Decision::Drop;
    };
    // SAFETY: bounds checked by `header_at`.
    let ip = unsafe { &*ip };
    let owned = match owned_by(sender, &ip.src_addr, |entry| {
        // SAFETY: a field address of a valid map value, not read here.
        unsafe { &raw const (*entry).v4 }
    }) {
        Owned::Yes => true,
        Owned::No => false,
        // SAFETY: one field read at once, before any update can reuse the slot.
        Owned::Unknown => {
            unsafe { ENDPOINTS_V4.get(ip.src_addr) }.map(host_ifindex) == Some(ingress)
        }
    };
    if !owned {
        return Decision::Drop;
    }
    let dst = ip.dst_addr;
    // SAFETY: the value is copied at once, before any update can reuse the slot.
    let target = match unsafe { ENDPOINTS_V4.get(dst) }.map(snapshot) {
        // Addressed to the sending pod itself: nothing to shortcut.
        Some(peer) if peer.host_ifindex == ingress => return Decision::Pass,
        Some(peer) => Target::pod(peer),
        None => match REMOTE_CIDRS_V4.get(&Key::new(32, dst)) {
            Some(node) => Target::remote(node),
            // SAFETY: only whether an entry is there is read.
            None if ip.proto == IPPROTO_TCP
                && flow::tcp_continues(start, end, EthHdr::LEN + Ipv4Hdr::LEN)
                && unsafe { PEER_NODES_V4.get(dst) }.is_some() =>
            {
                Target::peer_node()
            }
            None => return Decision::Pass,
        },
    };
    fast_path(flow::ipv4(ct, start, end, ip), target, eth, sender)
}

/// The fast path's answer for a packet to `target`, given what the host
/// stack has to say about its flow and whether a shaper wants the packet
/// (the sender's egress, or a local receiver's ingress, is shaped by qdiscs
/// on host veths that a redirect would skip).
#[inline(always)]
pub(crate) fn fast_path(
    judged: Flow,
    target: Target,
    eth: *mut EthHdr,
    sender: Sender,
) -> Decision {
    match (judged, target.local) {
        (Flow::NodePortReply, _) => Decision::NodePortReply,
        (Flow::Translated, _) => Decision::Translated,
        (Flow::Tracked, _) => Decision::Tracked,
        (Flow::Opaque, true) => Decision::Pass,
        // To a node address as before: the NodePort path's reply may be it.
        (Flow::Opaque, false) if target.peer_node => Decision::Pass,
        (Flow::Opaque, false) => Decision::RemoteToStack,
        (Flow::Clear, _) if sender.egress_shaped => Decision::Shaped,
        (Flow::Clear, true) if target.peer.flags & ENDPOINT_F_SHAPED_INGRESS != 0 => {
            Decision::Shaped
        }
        (Flow::Clear, true) => to_pod(eth, target.peer),
        (Flow::Clear, false) if target.peer_node => Decision::PeerNode,
        (Flow::Clear, false) if target.tunnel => Decision::Tunnel,
        (Flow::Clear, false) => Decision::Remote,
    }
}

#[inline(always)]
pub(crate) fn host_ifindex(entry: &Endpoint) -> u32 {
    // SAFETY: a valid, aligned map value for the program's run.
    unsafe { core::ptr::read_volatile(&entry.host_ifindex) }
}

/// Rewrites the frame for the destination pod: it must see a frame
/// addressed to it, coming from its host veth (its only neighbour), as if
/// the host had routed it.
#[inline(always)]
pub(crate) fn to_pod(eth: *mut EthHdr, peer: Endpoint) -> Decision {
    // SAFETY: `eth` was bounds checked by the caller; the frame is writable.
    unsafe {
        (*eth).dst_addr = peer.pod_mac;
        (*eth).src_addr = peer.host_mac;
    }
    Decision::ToPod {
        host_ifindex: peer.host_ifindex,
        slot: peer.counter_slot,
    }
}

/// Whose an IPv6 source address is, as far as forwarding goes.
#[derive(PartialEq, Eq)]
pub(crate) enum Source {
    /// One of the pod's addresses.
    Owned,
    /// Link-local, or unspecified (duplicate address detection), to a
    /// destination on the link: the host's to answer, never forwarded.
    Link,
    /// Anything else: dropped.
    Foreign,
}

#[inline(always)]
pub(crate) fn source_v6(ip: &Ipv6Hdr, sender: Sender) -> Source {
    let (src, dst) = (&ip.src_addr, &ip.dst_addr);
    if is_link_local(src) {
        return if is_link_local(dst) || is_multicast(dst) {
            Source::Link
        } else {
            Source::Foreign
        };
    }
    if *src == [0; 16] {
        return if is_multicast(dst) {
            Source::Link
        } else {
            Source::Foreign
        };
    }
    let owned = match owned_by(sender, src, |entry| {
        // SAFETY: as above.
        unsafe { &raw const (*entry).v6 }
    }) {
        Owned::Yes => true,
        Owned::No => false,
        // SAFETY: one field read at once, see above.
        Owned::Unknown => {
            unsafe { ENDPOINTS_V6.get(*src) }.map(host_ifindex) == Some(sender.ifindex)
        }
    };
    if owned {
        Source::Owned
    } else {
        Source::Foreign
    }
}

#[inline(always)]
pub(crate) fn ipv6(
    ct: &impl Conntrack,
    start: usize,
    end: usize,
    eth: *mut EthHdr,
    sender: Sender,
) -> Decision {
    let ingress = sender.ifindex;
    let Ok(ip) = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN) else {
        return Decision::Drop;
    };
    // SAFETY: bounds checked by `header_at`.
    let header = unsafe { &mut *ip };
    let source = source_v6(header, sender);
    if source == Source::Foreign {
        return Decision::Drop;
    }
    if header.next_hdr == IPPROTO_ICMPV6 {
        // Shorter ICMPv6 messages (echo, MLD) are simply not solicitations.
        if let Ok(nd) = header_at::<NeighbourMessage>(start, end, EthHdr::LEN + Ipv6Hdr::LEN) {
            // SAFETY: bounds checked by `header_at`.
            if unsafe { (*nd).icmp_type } == ND_NEIGHBOR_SOLICIT {
                return neighbour_solicitation(eth, header, nd, ingress);
            }
        }
    }
    if source == Source::Link {
        return Decision::Pass;
    }
    let dst = header.dst_addr;
    // SAFETY: copied at once, see above.
    let target = match unsafe { ENDPOINTS_V6.get(dst) }.map(snapshot) {
        Some(peer) if peer.host_ifindex == ingress => return Decision::Pass,
        Some(peer) => Target::pod(peer),
        None => match REMOTE_CIDRS_V6.get(&Key::new(128, dst)) {
            Some(node) => Target::remote(node),
            // SAFETY: only whether an entry is there is read.
            None if tcp_at(start, end, header)
                .is_some_and(|l4| flow::tcp_continues(start, end, l4))
                && unsafe { PEER_NODES_V6.get(dst) }.is_some() =>
            {
                Target::peer_node()
            }
            None => return Decision::Pass,
        },
    };
    fast_path(flow::ipv6(ct, start, end, header), target, eth, sender)
}

/// Where the TCP header of an IPv6 packet starts, if it is TCP (past a
/// jumbo Hop-by-Hop header, as `flow` reads it).
#[inline(always)]
fn tcp_at(start: usize, end: usize, ip: &Ipv6Hdr) -> Option<usize> {
    match flow::ipv6_transport(start, end, ip)? {
        (IPPROTO_TCP, l4) => Some(l4),
        _ => None,
    }
}

//! A frame from another node, on the uplink: straight into the local pod
//! it is for, when the fast path may take it.

use aya_ebpf::bindings::TC_ACT_SHOT;
use aya_ebpf::btf_maps::lpm_trie::Key;
use aya_ebpf::helpers::generated::bpf_redirect_peer;
use aya_ebpf::programs::TcContext;
use flatnet_common::{
    ENDPOINT_F_SHAPED_INGRESS, Endpoint, REMOTE_F_TUNNEL, RemoteNode, SOURCES_F_SHAPED_EGRESS,
    action,
};
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::counters::{Direction, count, count_pod};
use crate::decision::TC_NEXT;
use crate::flow::{Conntrack, Flow};
use crate::maps::endpoints::{ENDPOINTS_V4, ENDPOINTS_V6, POD_SOURCES};
use crate::maps::remote::{
    PEER_NODES_V4, PEER_NODES_V6, REMOTE_CIDRS_V4, REMOTE_CIDRS_V6, UPLINK_TO_PODS,
};
use crate::packet::{decrement_ttl, header_at, snapshot};
use crate::proto::{ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP};
use crate::{flow, policy};

/// Where a frame came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// The uplink: from a pod of a directly routed node if its source lies
    /// in a remote pod CIDR that is not tunnelled, or TCP from such a
    /// node's own address (`PEER_NODES_*`).
    Uplink,
    /// The VXLAN device, its inner source already checked against the
    /// tunnel's outer source (`tunnel::source`): a pod of the sending node.
    Tunnel,
}

/// Where a frame from the uplink goes.
pub(crate) enum Uplink {
    /// Into the local pod behind host veth `host_ifindex` (`slot`: its
    /// counters); the frame is rewritten as the host would forward it.
    /// `node_sourced`: from another node's own address, not its pod.
    ToPod {
        host_ifindex: u32,
        slot: u32,
        node_sourced: bool,
    },
    /// To the host stack, which tracks the flow (counted as `action`).
    ToStack(u32),
    /// To the host stack: not for a local pod, or the stack's to judge.
    Pass,
}

/// The local pod a frame from the uplink is for, if the fast path may take
/// it: only a packet from another node's pod, or of a TCP flow from a
/// directly routed node's own address, whose replies the fast path takes
/// too (`pod::ipv4`). From anywhere else (the outside, a node's UDP) the
/// replies go through the stack, so the stack must see this direction as
/// well, or its conntrack would see half a flow (and call the rest INVALID).
#[inline(always)]
pub(crate) fn uplink_to_pod(
    ct: &impl Conntrack,
    start: usize,
    end: usize,
    arrival: Arrival,
) -> Uplink {
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return Uplink::Pass;
    };
    // SAFETY: `header_at` checked the header lies inside the packet.
    let (peer, source, judged) = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
                return Uplink::Pass;
            };
            // SAFETY: bounds checked by `header_at`; the frame is writable.
            let ip = unsafe { &mut *ip };
            // SAFETY: copied at once, before any update can reuse the slot.
            let Some(peer) = (unsafe { ENDPOINTS_V4.get(ip.dst_addr) }).map(snapshot) else {
                return Uplink::Pass;
            };
            // An expiring packet is the stack's: it answers with ICMP.
            if ip.ttl <= 1 {
                return Uplink::Pass;
            }
            let source = whose_source(
                arrival,
                || REMOTE_CIDRS_V4.get(&Key::new(32, ip.src_addr)),
                // SAFETY: only whether an entry is there is read.
                || ip.proto == IPPROTO_TCP && unsafe { PEER_NODES_V4.get(ip.src_addr) }.is_some(),
            );
            if source == Peer::None {
                return Uplink::Pass;
            }
            if shaped(source, &peer) {
                return Uplink::ToStack(action::SHAPED);
            }
            let judged = flow::ipv4(ct, start, end, ip);
            if judged == Flow::Clear {
                decrement_ttl(ip);
            }
            (peer, source, judged)
        }
        ETH_P_IPV6 => {
            let Ok(ip) = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN) else {
                return Uplink::Pass;
            };
            // SAFETY: bounds checked by `header_at`; the frame is writable.
            let ip = unsafe { &mut *ip };
            // SAFETY: copied at once, see above.
            let Some(peer) = (unsafe { ENDPOINTS_V6.get(ip.dst_addr) }).map(snapshot) else {
                return Uplink::Pass;
            };
            if ip.hop_limit <= 1 {
                return Uplink::Pass;
            }
            let source = whose_source(
                arrival,
                || REMOTE_CIDRS_V6.get(&Key::new(128, ip.src_addr)),
                // SAFETY: as above.
                || {
                    matches!(flow::ipv6_transport(start, end, ip), Some((IPPROTO_TCP, _)))
                        && unsafe { PEER_NODES_V6.get(ip.src_addr) }.is_some()
                },
            );
            if source == Peer::None {
                return Uplink::Pass;
            }
            if shaped(source, &peer) {
                return Uplink::ToStack(action::SHAPED);
            }
            let judged = flow::ipv6(ct, start, end, ip);
            if judged == Flow::Clear {
                ip.hop_limit -= 1;
            }
            (peer, source, judged)
        }
        _ => return Uplink::Pass,
    };
    match judged {
        Flow::Clear => {}
        Flow::Translated => return Uplink::ToStack(action::TRANSLATED),
        Flow::Tracked => return Uplink::ToStack(action::TRACKED),
        // (A local backend's reply tuple, arriving from outside: the stack's.)
        Flow::Opaque | Flow::NodePortReply => return Uplink::Pass,
    }
    // SAFETY: bounds checked above; the frame is writable.
    unsafe {
        (*eth).dst_addr = peer.pod_mac;
        (*eth).src_addr = peer.host_mac;
    }
    Uplink::ToPod {
        host_ifindex: peer.host_ifindex,
        slot: peer.counter_slot,
        node_sourced: source == Peer::Node,
    }
}

/// Whether a qdisc on the pod's host veth shapes the flow, which a redirect
/// would skip: the pod's ingress (`ENDPOINT_F_SHAPED_INGRESS`), or, in a
/// node's flow, its egress too, where the replies would meet the stack
/// halfway through the flow.
#[inline(always)]
fn shaped(source: Peer, pod: &Endpoint) -> bool {
    if pod.flags & ENDPOINT_F_SHAPED_INGRESS != 0 {
        return true;
    }
    source == Peer::Node
        && POD_SOURCES.get(pod.counter_slot).is_some_and(|sources| {
            // SAFETY: a valid map value for the program's run; one field read once.
            (unsafe { core::ptr::read_volatile(&sources.flags) }) & SOURCES_F_SHAPED_EGRESS != 0
        })
}

/// Whose a frame's source is, as far as the fast path from the uplink goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// Not a peer the fast path takes packets from: the stack judges it.
    None,
    /// Another node's pod.
    Pod,
    /// A directly routed node's own address, and the packet TCP: a pod's
    /// TCP reply can be told from a connection it opens (a SYN), which the
    /// stack must see to masquerade it; a UDP one cannot.
    Node,
}

/// Whose a frame's source is, given where it arrived: through the tunnel,
/// the sending node's pod (checked already); on the uplink, a directly
/// routed node's pod (a tunnelled node's pods arrive encapsulated, or the
/// stack judges them), else a directly routed node's own address when
/// `node_address` says so.
#[inline(always)]
fn whose_source<'a>(
    arrival: Arrival,
    pod_cidr: impl FnOnce() -> Option<&'a RemoteNode>,
    node_address: impl FnOnce() -> bool,
) -> Peer {
    match arrival {
        Arrival::Tunnel => Peer::Pod,
        Arrival::Uplink => match pod_cidr() {
            None if node_address() => Peer::Node,
            None => Peer::None,
            // SAFETY: a valid map value for the program's run; one field read once.
            Some(node)
                if (unsafe { core::ptr::read_volatile(&node.flags) } & REMOTE_F_TUNNEL) == 0 =>
            {
                Peer::Pod
            }
            Some(_) => Peer::None,
        },
    }
}

/// A packet from another node's pod straight into the local pod it is
/// for, unless the host must see it (`uplink_to_pod`) or the pod's ingress
/// policy refuses it; `delivered`: the `STATS` action it counts as.
#[inline(always)]
pub(crate) fn deliver(ctx: &TcContext, arrival: Arrival, delivered: u32) -> i32 {
    // SAFETY: a read of a constant the loader set (frozen .rodata).
    if unsafe { core::ptr::read_volatile(&UPLINK_TO_PODS) } == 0 {
        return TC_NEXT;
    }
    let len = ctx.len();
    let (host_ifindex, slot, delivered) =
        match uplink_to_pod(ctx, ctx.data(), ctx.data_end(), arrival) {
            Uplink::ToPod {
                host_ifindex,
                slot,
                node_sourced,
            } => (
                host_ifindex,
                slot,
                if node_sourced {
                    action::PEER_NODE_TO_POD
                } else {
                    delivered
                },
            ),
            Uplink::ToStack(what) => {
                count(what, len);
                return TC_NEXT;
            }
            Uplink::Pass => return TC_NEXT,
        };
    // The pod's ingress policy, on the frame as rewritten (only its MACs
    // and TTL changed).
    if !policy::ingress_allowed(ctx.data(), ctx.data_end(), slot, len) {
        count(action::POLICY_DENIED, len);
        return TC_ACT_SHOT as i32;
    }
    // SAFETY: plain helper call; a stale ifindex makes the kernel drop the
    // frame (with flags 0 the helper itself never fails).
    let verdict = unsafe { bpf_redirect_peer(host_ifindex, 0) } as i32;
    count(delivered, len);
    count_pod(slot, Direction::Rx, len);
    verdict
}

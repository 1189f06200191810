//! A frame from another node, on the uplink: straight into the local pod
//! it is for, when the fast path may take it.

use crate::*;

/// Where a frame came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// The uplink: from a pod of a directly routed node if its source lies
    /// in a remote pod CIDR that is not tunnelled.
    Uplink,
    /// The VXLAN device, its inner source already checked against the
    /// tunnel's outer source (`tunnel::source`): a pod of the sending node.
    Tunnel,
}

/// Where a frame from the uplink goes.
pub(crate) enum Uplink {
    /// Into the local pod behind host veth `host_ifindex` (`slot`: its
    /// counters); the frame is rewritten as the host would forward it.
    ToPod { host_ifindex: u32, slot: u32 },
    /// To the host stack, which tracks the flow (counted as `action`).
    ToStack(u32),
    /// To the host stack: not for a local pod, or the stack's to judge.
    Pass,
}

/// The local pod a frame from the uplink is for, if the fast path may take
/// it: only a packet from another node's pod, whose replies the fast path
/// takes too. From anywhere else (a node's address, the outside) the
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
    let (peer, judged) = match u16::from_be(unsafe { (*eth).ether_type }) {
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
            if ip.ttl <= 1
                || !from_peer_pod(arrival, || REMOTE_CIDRS_V4.get(&Key::new(32, ip.src_addr)))
            {
                return Uplink::Pass;
            }
            if peer.flags & ENDPOINT_F_SHAPED_INGRESS != 0 {
                return Uplink::ToStack(action::SHAPED);
            }
            let judged = flow::ipv4(ct, start, end, ip);
            if judged == Flow::Clear {
                decrement_ttl(ip);
            }
            (peer, judged)
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
            if ip.hop_limit <= 1
                || !from_peer_pod(arrival, || REMOTE_CIDRS_V6.get(&Key::new(128, ip.src_addr)))
            {
                return Uplink::Pass;
            }
            if peer.flags & ENDPOINT_F_SHAPED_INGRESS != 0 {
                return Uplink::ToStack(action::SHAPED);
            }
            let judged = flow::ipv6(ct, start, end, ip);
            if judged == Flow::Clear {
                ip.hop_limit -= 1;
            }
            (peer, judged)
        }
        _ => return Uplink::Pass,
    };
    match judged {
        Flow::Clear => {}
        Flow::Translated => return Uplink::ToStack(action::TRANSLATED),
        Flow::Tracked => return Uplink::ToStack(action::TRACKED),
        Flow::Opaque => return Uplink::Pass,
    }
    // SAFETY: bounds checked above; the frame is writable.
    unsafe {
        (*eth).dst_addr = peer.pod_mac;
        (*eth).src_addr = peer.host_mac;
    }
    Uplink::ToPod {
        host_ifindex: peer.host_ifindex,
        slot: peer.counter_slot,
    }
}

/// Whether a frame's source is another node's pod the fast path may take
/// from where it arrived: through the tunnel, checked already; on the
/// uplink, a directly routed node's (a tunnelled node's pods arrive
/// encapsulated, or the stack judges them).
#[inline(always)]
fn from_peer_pod<'a>(arrival: Arrival, node: impl FnOnce() -> Option<&'a RemoteNode>) -> bool {
    match arrival {
        Arrival::Tunnel => true,
        Arrival::Uplink => match node() {
            None => false,
            // SAFETY: a valid map value for the program's run; one field read once.
            Some(node) => (unsafe { core::ptr::read_volatile(&node.flags) } & REMOTE_F_TUNNEL) == 0,
        },
    }
}

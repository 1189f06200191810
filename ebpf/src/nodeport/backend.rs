//! A translated packet (or an ICMP error about a reply) on to its
//! backend: into the pod when it is on this node, else to its node by the
//! tunnel or the FIB's route.

use aya_ebpf::bindings::{BPF_FIB_LOOKUP_OUTPUT, TC_ACT_SHOT};
use aya_ebpf::helpers::generated::bpf_redirect_peer;
use aya_ebpf::programs::TcContext;
use flatnet_common::{Endpoint, FAST_PATH_MARK, NatForward, action};
use network_types::eth::EthHdr;

use crate::counters::{Direction, count, count_pod};
use crate::maps::endpoints::{ENDPOINTS_V4, ENDPOINTS_V6};
use crate::maps::nodeport::Scratch;
use crate::nodeport::icmp;
use crate::nodeport::ports::load_nat_source;
use crate::nodeport::rewrite::{Toward, rewrite};
use crate::packet::{header_at, snapshot};
use crate::remote::{route_to_remote, take_hop};
use crate::{policy, tunnel};

/// A flow's packet translated to its backend (`s.forward`) and sent there.
#[inline(never)]
pub(crate) fn to_backend(ctx: &TcContext, s: &mut Scratch, uplink: u32) -> i32 {
    if rewrite(ctx, s, Toward::Backend).is_none() {
        return TC_ACT_SHOT as i32;
    }
    deliver_to_backend(ctx, s, uplink)
}

/// An ICMP error about a reply of the flow `flow` (the client's tuple),
/// made the backend's and sent to it.
#[inline(never)]
pub(crate) fn icmp_error_in(
    ctx: &TcContext,
    s: &mut Scratch,
    flow: *const NatForward,
    uplink: u32,
) -> i32 {
    // SAFETY: a valid map value for the program's run; read once.
    s.forward = unsafe { core::ptr::read_volatile(flow) };
    load_nat_source(s);
    icmp::toward_backend(s);
    if icmp::rewrite_error(ctx, s).is_none() {
        count(action::NODEPORT_DROPPED, ctx.len());
        return TC_ACT_SHOT as i32;
    }
    deliver_to_backend(ctx, s, uplink)
}

/// A translated packet to the flow's backend (`s.forward`): into the pod
/// when it is on this node, else to its node.
#[inline(always)]
fn deliver_to_backend(ctx: &TcContext, s: &Scratch, uplink: u32) -> i32 {
    let backend = &s.forward.backend;
    let local = if s.key.family == 4 {
        let address = [backend[0], backend[1], backend[2], backend[3]];
        // SAFETY: copied at once, before any update can reuse the slot.
        unsafe { ENDPOINTS_V4.get(address) }.map(snapshot)
    } else {
        // SAFETY: as above.
        unsafe { ENDPOINTS_V6.get(*backend) }.map(snapshot)
    };
    match local {
        Some(peer) => into_pod(ctx, &peer, s.key.family == 4),
        None => to_node(ctx, uplink),
    }
}

/// A translated packet into the local backend pod `peer`, as the stack
/// would route it (TTL, MACs), its ingress policy judged first.
#[inline(never)]
fn into_pod(ctx: &TcContext, peer: &Endpoint, ipv4: bool) -> i32 {
    let len = ctx.len();
    let (start, end) = (ctx.data(), ctx.data_end());
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return TC_ACT_SHOT as i32;
    };
    if take_hop(start, end, ipv4).is_none() {
        return TC_ACT_SHOT as i32;
    }
    // SAFETY: bounds checked by `header_at`; the frame is writable.
    unsafe {
        (*eth).dst_addr = peer.pod_mac;
        (*eth).src_addr = peer.host_mac;
    }
    if !policy::ingress_allowed(start, end, peer.counter_slot, len) {
        count(action::POLICY_DENIED, len);
        return TC_ACT_SHOT as i32;
    }
    count(action::NODEPORT_TO_POD, len);
    count_pod(peer.counter_slot, Direction::Rx, len);
    // SAFETY: plain helper call; a stale ifindex makes the kernel drop it.
    (unsafe { bpf_redirect_peer(peer.host_ifindex, 0) }) as i32
}

/// A translated packet to its backend on another node: into the tunnel
/// when that node's pod CIDR is tunnelled, else by the FIB's route out of
/// the uplink, as the node would send it.
#[inline(never)]
fn to_node(ctx: &TcContext, uplink: u32) -> i32 {
    let len = ctx.len();
    let sent =
        tunnel::send(ctx).or_else(|| route_to_remote(ctx, uplink, BPF_FIB_LOOKUP_OUTPUT as u32));
    match sent {
        Some(verdict) => {
            // SAFETY: the context pointer is valid; `mark` is writable in tc.
            unsafe { (*ctx.skb.skb).mark = FAST_PATH_MARK };
            count(action::NODEPORT_TO_NODE, len);
            verdict
        }
        None => {
            count(action::NODEPORT_DROPPED, len);
            TC_ACT_SHOT as i32
        }
    }
}

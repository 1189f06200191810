//! The programs of the node's uplink: `from_uplink` (tc ingress) with its
//! tail-called `nodeport_in` and `uplink_deliver`, and `to_uplink` (tc
//! egress, of the VXLAN device too).

use aya_ebpf::macros::classifier;
use aya_ebpf::programs::TcContext;
use flatnet_common::{FAST_PATH_MARK, action, nodeport_call};

use crate::decision::TC_NEXT;
use crate::maps::nodeport::NODEPORT_CALLS;
use crate::proto::PACKET_HOST;
use crate::send::sent_on;
use crate::uplink::{Arrival, deliver};
use crate::{flow, nodeport};

/// tc ingress of the node's uplink: a packet from another node (or from
/// anywhere) for a local pod goes straight into the pod; the rest is the
/// host's.
#[classifier]
pub fn from_uplink(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    if unsafe { (*ctx.skb.skb).pkt_type } != PACKET_HOST {
        return TC_NEXT;
    }
    // Both modes: a NodePort flow is all flatnet's, whatever the stack
    // carries for pods in XDP mode (`deliver` below).
    if nodeport::parse::candidate(ctx.data(), ctx.data_end()) {
        // SAFETY: a tail call; on failure (no entry) it returns here.
        unsafe { NODEPORT_CALLS.tail_call(&ctx, nodeport_call::IN) };
    }
    deliver(&ctx, Arrival::Uplink, action::FROM_UPLINK)
}

/// Tail-called by `from_uplink` for a packet to a port of the NodePort
/// path's: translated and sent on, or, not the path's after all, on to
/// `from_uplink`'s own work (`uplink_deliver`).
#[classifier]
pub fn nodeport_in(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let uplink = unsafe { (*ctx.skb.skb).ifindex };
    if let Some(verdict) = nodeport::flow::from_outside(&ctx, uplink) {
        return sent_on(&ctx, verdict);
    }
    // SAFETY: a tail call; on failure (no entry) it returns here.
    unsafe { NODEPORT_CALLS.tail_call(&ctx, nodeport_call::UPLINK_DELIVER) };
    TC_NEXT
}

/// `from_uplink`'s work for a packet `nodeport_in` did not take.
#[classifier]
pub fn uplink_deliver(ctx: TcContext) -> i32 {
    deliver(&ctx, Arrival::Uplink, action::FROM_UPLINK)
}

/// tc egress of the node's uplink and of its VXLAN device: a packet the
/// host stack sends to another node makes its flow lose a "clear" verdict (`flow`); the fast
/// path's own packets (marked by `from_pod`) pass with the mark cleared.
#[classifier]
pub fn to_uplink(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let skb = ctx.skb.skb;
    // SAFETY: as above; `mark` is readable and writable in tc.
    if unsafe { (*skb).mark } == FAST_PATH_MARK {
        // SAFETY: as above.
        unsafe { (*skb).mark = 0 };
        return TC_NEXT;
    }
    flow::forget_clear(ctx.data(), ctx.data_end());
    TC_NEXT
}

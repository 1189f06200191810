//! Sending a pod's (or the NodePort path's) packet on to another node:
//! routed by the FIB (`route_to_remote`) or into the VXLAN tunnel, or to
//! the stack when neither can.

use aya_ebpf::programs::TcContext;
use flatnet_common::{FAST_PATH_MARK, action};

use crate::counters::count;
use crate::decision::TC_NEXT;
use crate::remote::route_to_remote;
use crate::{nodeport, tunnel};

/// A pod's packet for a tunnelled node's pod into the VXLAN device, or to
/// the stack when `tunnel::send` cannot.
#[inline(always)]
pub(crate) fn tunnelled(ctx: &TcContext) -> i32 {
    match tunnel::send(ctx) {
        Some(verdict) => {
            // Past `to_uplink` at the device's egress untouched.
            // SAFETY: the context pointer is valid; `mark` is writable in tc.
            unsafe { (*ctx.skb.skb).mark = FAST_PATH_MARK };
            count(action::TO_TUNNEL, ctx.len());
            verdict
        }
        None => {
            count(action::REMOTE_PASSED, ctx.len());
            TC_NEXT
        }
    }
}

/// The NodePort path's verdict on a translated packet, the tunnel's when
/// the path left the packet to it (`nodeport::TO_TUNNEL`).
#[inline(always)]
pub(crate) fn sent_on(ctx: &TcContext, verdict: i32) -> i32 {
    if verdict == nodeport::TO_TUNNEL {
        tunnelled_elsewhere(ctx)
    } else {
        verdict
    }
}

/// `tunnelled` in a frame of its own, as `routed_to_peer_node`.
#[inline(never)]
fn tunnelled_elsewhere(ctx: &TcContext) -> i32 {
    tunnelled(ctx)
}

/// `routed` in a frame of its own: `nodeport_reply`'s deepest calls and
/// the FIB lookup's structures would not fit one 512-byte stack together.
#[inline(never)]
pub(crate) fn routed_to_peer_node(ctx: &TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let ingress = unsafe { (*ctx.skb.skb).ifindex };
    routed(ctx, ingress, action::TO_PEER_NODE)
}

/// A pod's packet for another node, sent the way the FIB says
/// (`route_to_remote`, counted as `sent`), or to the stack when it has no
/// usable answer.
#[inline(always)]
pub(crate) fn routed(ctx: &TcContext, ingress: u32, sent: u32) -> i32 {
    match route_to_remote(ctx, ingress, 0) {
        Some(verdict) => {
            // Past `to_uplink` untouched: not the stack's packet.
            // SAFETY: the context pointer is valid; `mark` is writable in tc.
            unsafe { (*ctx.skb.skb).mark = FAST_PATH_MARK };
            count(sent, ctx.len());
            verdict
        }
        None => {
            count(action::REMOTE_PASSED, ctx.len());
            TC_NEXT
        }
    }
}

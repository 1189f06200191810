//! NodePort, externalIPs and load-balancer IPs for clients outside the
//! node, at the uplink's tc ingress (kube-proxy's KUBE-NODEPORTS and
//! KUBE-EXT chains, in BPF).
//!
//! A flow's first packet to a frontend outside clients may reach (a port in
//! `EXTERNAL_PORTS`; a NodePort on one of this node's addresses that
//! `NODEPORT_ADDRS` lists, or an externalIP or load-balancer IP) is given a
//! backend: at random, or the client address's with sessionAffinity. Its
//! destination becomes the backend; with `externalTrafficPolicy: Cluster`
//! its source becomes the node address it came to, on a free port of
//! `NAT_PORT_MIN..=NAT_PORT_MAX`, as kube-proxy masquerades, so the reply
//! comes back here; with `Local` only this node's backends serve it and the
//! client's address is kept. `NAT_FORWARD` keeps the flow's translation by
//! the client's tuple, `NAT_REVERSE` the way back by the reply's, so every
//! later packet takes the same backend and every reply is translated back
//! (source: the frontend; destination: the client) and sent out of the
//! uplink the flow came by. A backend on this node gets the packet straight
//! (`bpf_redirect_peer`, its ingress policy judged first); one on another
//! node through the FIB's route or the tunnel. The node's agent collects
//! idle flows (`flatnet_agent::nat`); both tables are LRU, so a full one
//! forgets its oldest flow rather than refuse a new one.
//!
//! The path runs in programs of its own that `from_uplink` and `from_pod`
//! tail-call (`NODEPORT_CALLS`), and keeps its structures in a per-CPU
//! scratch area (`NODEPORT_SCRATCH`): a program and the functions it calls
//! may use 512 bytes of stack in all, which `from_uplink`'s own frame and
//! these would pass.
//!
//! The host stack sees none of these packets, in either direction: its
//! conntrack and netfilter never meet the flow (as with the fast path's
//! pod-to-pod flows), so a translated flow needs no `FLOWS` verdict.
//! Handled: TCP and UDP over IPv4 without options, and over IPv6 with no
//! extension header but a fragment header (fragments in both families: the
//! later ones by their first one's ports, `NAT_FRAGMENTS` and
//! `NAT_FRAGMENTS6`); ICMP errors about such packets (`icmp`); the rest
//! goes to the stack.
//!
//! By step: `parse` reads a packet's flow (fragments too), `icmp` the
//! errors about one; `flow` finds or starts its translation, `ports` the
//! node port it is given; `rewrite` sets its ends and checksums; `backend`
//! sends it to its backend and `reply` a reply back to its client. The
//! maps and the scratch area are in `maps::nodeport`.

use aya_ebpf::programs::TcContext;
use flatnet_common::nodeport_call;

use crate::maps::nodeport::NODEPORT_CALLS;

pub(crate) mod backend;
pub(crate) mod flow;
pub(crate) mod icmp;
pub(crate) mod parse;
pub(crate) mod ports;
pub(crate) mod reply;
pub(crate) mod rewrite;

/// A flow's `last_ns` is written at most this often.
pub(crate) const REFRESH_NS: u64 = 1_000_000_000;

/// Where a packet `nodeport_reply` finds no reply of a translated flow
/// goes: where the program that tail-called it would have sent it. Passed
/// in `skb->cb[0]`, which the tail call keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum NotReply {
    /// To the host stack.
    ToStack = 0,
    /// Routed to another node's address (`Decision::PeerNode`).
    ToPeerNode = 1,
}

/// Tail-calls `nodeport_reply` for a pod's packet; `otherwise`: where it
/// goes if it is no reply of a translated flow. Returns only when the call
/// fails (no entry: the path is not loaded).
#[inline(always)]
pub(crate) fn reply_or(ctx: &TcContext, otherwise: NotReply) {
    // SAFETY: the context pointer is valid; `cb` is writable in tc.
    unsafe { (*ctx.skb.skb).cb[0] = otherwise as u32 };
    // SAFETY: a tail call; on failure (no entry) it returns here.
    unsafe { NODEPORT_CALLS.tail_call(ctx, nodeport_call::REPLY) };
}

/// What `reply_or` said of the packet at hand.
#[inline(always)]
pub(crate) fn not_reply(ctx: &TcContext) -> NotReply {
    // SAFETY: the context pointer is valid for the program's run.
    match unsafe { (*ctx.skb.skb).cb[0] } {
        1 => NotReply::ToPeerNode,
        _ => NotReply::ToStack,
    }
}

/// What the path answers for a translated packet that must go into the
/// VXLAN tunnel: no tc verdict, the calling program sends it
/// (`tunnel::send` needs a frame of its own, which the path's deepest
/// calls leave no room for).
pub(crate) const TO_TUNNEL: i32 = i32::MIN;

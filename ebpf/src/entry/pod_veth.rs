//! The programs of a pod's host veth: `from_pod` (tc ingress) and its
//! tail-called `nodeport_reply`, `from_pod_xdp` (XDP) with
//! `from_pod_passed` (tc ingress in XDP mode) and `pod_xdp_pass` (on the
//! peer, so that it accepts XDP frames), `to_pod` (tc egress); and the
//! decision they share on a pod's frame: who sent it, where it goes, its
//! policy and its counters.

use aya_ebpf::bindings::{TC_ACT_SHOT, xdp_action};
use aya_ebpf::helpers::generated::{bpf_redirect, bpf_redirect_peer};
use aya_ebpf::macros::{classifier, xdp};
use aya_ebpf::programs::{TcContext, XdpContext};
use flatnet_common::{NO_COUNTER_SLOT, SOURCES_F_SHAPED_EGRESS, action, preferred_slot};
use network_types::eth::EthHdr;
use network_types::ip::Ipv4Hdr;

use crate::counters::{Direction, count, count_pod};
use crate::decision::{Decision, TC_NEXT};
use crate::flow::{self, Conntrack};
use crate::maps::endpoints::{ENDPOINTS_V4, HOST_VETHS, POD_SOURCES};
use crate::packet::{header_at, snapshot};
use crate::pod::{self, frame};
use crate::proto::ETH_P_IP;
use crate::send::{routed, routed_to_peer_node, sent_on, tunnelled};
use crate::sender::Sender;
use crate::{external_ports, nodeport, policy, variant};

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    match variant::current() {
        flatnet_common::cost_variant::RETURN => return TC_NEXT,
        flatnet_common::cost_variant::REDIRECT_ONLY => return redirect_only(&ctx),
        _ => {}
    }
    // SAFETY: the context pointer is valid for the program's run.
    let ingress = unsafe { (*ctx.skb.skb).ifindex };
    let sender = sender(ingress, ctx.len());
    match decide(&ctx, ctx.data(), ctx.data_end(), sender, ctx.len()) {
        // A backend's reply to a client outside, of a flow the uplink
        // translated, goes back the way it came (`nodeport_reply`); the
        // stack takes what that program does not, as it takes the rest.
        // Only while something listens for outside clients (an array
        // read): none with kube-proxy, where the table is always empty.
        Decision::Pass => {
            if external_ports::any_listening() {
                nodeport::reply_or(&ctx, nodeport::NotReply::ToStack);
            }
            TC_NEXT
        }
        Decision::Translated | Decision::Tracked | Decision::Shaped => TC_NEXT,
        Decision::NodePortReply => {
            nodeport::reply_or(&ctx, nodeport::NotReply::ToStack);
            TC_NEXT
        }
        // What only the stack may judge (a fragment, IPv4 options) to
        // another node's pod may still be a reply of a flow the uplink
        // translated keeping a pod client's address: asked, as `Pass` is.
        Decision::RemoteToStack => {
            if external_ports::any_listening() {
                nodeport::reply_or(&ctx, nodeport::NotReply::ToStack);
            }
            TC_NEXT
        }
        Decision::Drop | Decision::Denied => TC_ACT_SHOT as i32,
        // SAFETY: plain helper call; a stale ifindex makes the kernel drop
        // the frame (with flags 0 the helper itself never fails).
        Decision::ToPod { host_ifindex, .. } => {
            (unsafe { bpf_redirect_peer(host_ifindex, 0) }) as i32
        }
        // SAFETY: plain helper call: egress of the same veth, back to the pod.
        Decision::Bounce => (unsafe { bpf_redirect(ingress, 0) }) as i32,
        Decision::Remote => routed(&ctx, ingress, action::TO_REMOTE_NODE),
        Decision::PeerNode => {
            if external_ports::any_listening() {
                nodeport::reply_or(&ctx, nodeport::NotReply::ToPeerNode);
            }
            routed(&ctx, ingress, action::TO_PEER_NODE)
        }
        Decision::Tunnel => tunnelled(&ctx),
    }
}

/// Tail-called by `from_pod` for a packet it hands to the stack or routes
/// to another node's address: a local backend's reply of a flow the uplink
/// translated goes back to the client; the rest goes where `from_pod`
/// would have sent it (`nodeport::NotReply`).
#[classifier]
pub fn nodeport_reply(ctx: TcContext) -> i32 {
    if let Some(verdict) = nodeport::reply::reply_from_pod(&ctx) {
        return sent_on(&ctx, verdict);
    }
    match nodeport::not_reply(&ctx) {
        nodeport::NotReply::ToStack => TC_NEXT,
        nodeport::NotReply::ToPeerNode => routed_to_peer_node(&ctx),
    }
}

#[xdp]
pub fn from_pod_xdp(ctx: XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    let ingress = ctx.ingress_ifindex() as u32;
    let len = (end - start) as u32;
    let sender = sender(ingress, len);
    match decide(&ctx, start, end, sender, len) {
        Decision::Pass
        | Decision::Translated
        | Decision::Tracked
        | Decision::RemoteToStack
        | Decision::NodePortReply
        | Decision::Shaped => xdp_action::XDP_PASS,
        Decision::Drop | Decision::Denied => xdp_action::XDP_DROP,
        // SAFETY: plain helper call: transmit on the destination's host veth,
        // which hands the frame to its peer, the destination pod.
        Decision::ToPod { host_ifindex, .. } => (unsafe { bpf_redirect(host_ifindex, 0) }) as u32,
        Decision::Bounce => xdp_action::XDP_TX,
        // bpf_redirect_neigh and tunnel keys are tc-only: the stack routes
        // (and encapsulates) it in XDP mode.
        Decision::Remote | Decision::Tunnel | Decision::PeerNode => {
            count(action::REMOTE_PASSED, end.saturating_sub(start) as u32);
            xdp_action::XDP_PASS
        }
    }
}

/// tc ingress of a pod's host veth in XDP mode: what `from_pod_xdp`
/// passed to the stack. A local backend's reply of a flow the uplink
/// translated goes back to its client (`nodeport_reply`), as from
/// `from_pod` in tc mode: its rewrite and its way out need tc's helpers
/// (checksum patches, `bpf_redirect_neigh`). Frames XDP redirected never
/// get here.
#[classifier]
pub fn from_pod_passed(ctx: TcContext) -> i32 {
    if external_ports::any_listening() {
        nodeport::reply_or(&ctx, nodeport::NotReply::ToStack);
    }
    TC_NEXT
}

#[xdp]
pub fn pod_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// tc egress of a pod's host veth: what the host stack delivers into the
/// pod (from the host itself, a Service's backend after the host's DNAT,
/// another node through the stack), judged against the pod's ingress
/// policy. Frames the datapath redirects into a pod never pass here (a
/// redirect to the peer skips this hook): they were judged where they were
/// redirected. Traffic from the node's own addresses (`LOCAL_ADDRS`:
/// kubelet's probes) is always allowed.
#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    // The host stack carries this packet: from now on it may track the flow.
    flow::forget_clear(ctx.data(), ctx.data_end());
    // SAFETY: the context pointer is valid for the program's run.
    let egress = unsafe { (*ctx.skb.skb).ifindex };
    let len = ctx.len();
    let pod = policy::of_slot(slot_of(egress));
    if !pod.selected() {
        return TC_NEXT;
    }
    if policy::frame_allowed(
        ctx.data(),
        ctx.data_end(),
        pod,
        flatnet_common::POLICY_DIR_INGRESS,
        true,
        len,
    ) {
        TC_NEXT
    } else {
        count(action::POLICY_DENIED, len);
        TC_ACT_SHOT as i32
    }
}

/// `cost_variant::REDIRECT_ONLY`: an IPv4 packet for a local pod goes into
/// it, everything else to the stack. No source check, flow, policy or
/// counter.
#[inline(always)]
pub(crate) fn redirect_only(ctx: &TcContext) -> i32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return TC_NEXT;
    };
    // SAFETY: `header_at` checked the header lies inside the packet.
    if u16::from_be(unsafe { (*eth).ether_type }) != ETH_P_IP {
        return TC_NEXT;
    }
    let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
        return TC_NEXT;
    };
    // SAFETY: bounds checked; the entry is copied at once.
    let Some(peer) = (unsafe { ENDPOINTS_V4.get((*ip).dst_addr) }).map(snapshot) else {
        return TC_NEXT;
    };
    match pod::to_pod(eth, peer) {
        // SAFETY: plain helper call, as in `from_pod`.
        Decision::ToPod { host_ifindex, .. } => {
            (unsafe { bpf_redirect_peer(host_ifindex, 0) }) as i32
        }
        _ => TC_NEXT,
    }
}

/// The pod behind host veth `ingress`. Its counter slot: the one the
/// ifindex suggests when that slot is this veth's (the common case, an
/// array read), else the one `HOST_VETHS` records.
#[inline(always)]
fn sender(ingress: u32, len: u32) -> Sender {
    let (slot, flags) = slot_and_flags(ingress);
    Sender {
        ifindex: ingress,
        slot,
        egress_shaped: flags & SOURCES_F_SHAPED_EGRESS != 0,
        policy: policy::of_slot(slot),
        len,
    }
}

/// The counter slot of the pod behind host veth `ifindex`.
#[inline(always)]
fn slot_of(ifindex: u32) -> u32 {
    slot_and_flags(ifindex).0
}

/// The counter slot of the pod behind host veth `ingress` and the flags of
/// its `POD_SOURCES` entry.
#[inline(always)]
fn slot_and_flags(ingress: u32) -> (u32, u32) {
    let guess = preferred_slot(ingress);
    let mut slot = NO_COUNTER_SLOT;
    let mut entry = POD_SOURCES.get_ptr(guess);
    if let Some(sources) = entry {
        // SAFETY: a valid map value for the program's run; one field read once.
        if unsafe { core::ptr::read_volatile(&(*sources).host_ifindex) } == ingress {
            slot = guess;
        }
    }
    if slot == NO_COUNTER_SLOT {
        // SAFETY: one field read at once, before any update can reuse the slot.
        slot = unsafe { HOST_VETHS.get(ingress) }.map_or(NO_COUNTER_SLOT, |me| unsafe {
            core::ptr::read_volatile(&me.counter_slot)
        });
        entry = POD_SOURCES.get_ptr(slot);
    }
    let flags = match entry {
        // SAFETY: as above.
        Some(sources) if slot != NO_COUNTER_SLOT => unsafe {
            core::ptr::read_volatile(&(*sources).flags)
        },
        _ => 0,
    };
    (slot, flags)
}

#[inline(always)]
fn decide(ct: &impl Conntrack, start: usize, end: usize, sender: Sender, len: u32) -> Decision {
    count_pod(sender.slot, Direction::Tx, len);
    let decision = policy_judged(frame(ct, start, end, sender), start, end, &sender);
    match decision {
        Decision::Pass => count(action::PASSED, len),
        Decision::Translated => count(action::TRANSLATED, len),
        Decision::Tracked => count(action::TRACKED, len),
        Decision::Drop => count(action::DROPPED, len),
        Decision::RemoteToStack => count(action::REMOTE_PASSED, len),
        Decision::Shaped => count(action::SHAPED, len),
        Decision::Denied => count(action::POLICY_DENIED, len),
        Decision::ToPod { slot, .. } => {
            count(action::REDIRECTED, len);
            count_pod(slot, Direction::Rx, len);
        }
        // Counted by the program that routes it.
        Decision::Bounce
        | Decision::Remote
        | Decision::Tunnel
        | Decision::PeerNode
        | Decision::NodePortReply => {}
    }
    decision
}

/// NetworkPolicy on a pod's frame the datapath has decided about: the
/// sender's egress for whatever it sends (to a pod, another node, the host),
/// then a local receiver's ingress before the redirect into it (a frame
/// that goes to the stack instead meets that in `to_pod`). Judged here,
/// once, after the decision's many paths have joined, not inside each:
/// inlined into every path, the verifier's work grew past its limit. The
/// frame is as the pod sent it but for the MACs of a redirect.
#[inline(always)]
fn policy_judged(decision: Decision, start: usize, end: usize, sender: &Sender) -> Decision {
    if variant::without(flatnet_common::cost_variant::NO_POLICY) {
        return decision;
    }
    let slot = match decision {
        // The source check's drops, neighbour answers: not policy's.
        Decision::Drop | Decision::Bounce | Decision::Denied => return decision,
        Decision::ToPod { slot, .. } => slot,
        _ => NO_COUNTER_SLOT,
    };
    if !policy::sent_frame_allowed(start, end, sender, slot) {
        return Decision::Denied;
    }
    decision
}

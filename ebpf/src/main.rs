//! flatnet datapath: programs on the host side of every pod veth, and one on
//! the node's uplink.
//!
//! Both attachment modes run the same decision on every frame a pod sends:
//! answer its ARP requests and IPv6 neighbour solicitations itself (so pods
//! never need a bridge to find neighbours), hand IPv4/IPv6 packets for
//! another local pod straight to that pod, and return everything else to
//! the host stack. `from_pod` (tc ingress) delivers with `bpf_redirect_peer`;
//! `from_pod_xdp` (XDP) with `bpf_redirect` into the destination's host veth,
//! whose peer runs `pod_xdp_pass` so that it accepts XDP frames.
//!
//! Cross-node: a packet for another node's pod CIDR (the `REMOTE_CIDRS_*`
//! tries the node agent fills) leaves `from_pod` through the kernel's own
//! route to that node (`bpf_fib_lookup`, then `bpf_redirect`, or
//! `bpf_redirect_neigh` while the next hop's MAC is unknown), or goes to
//! the host stack when the FIB has no usable answer. `from_uplink`, on the
//! node's uplink, hands packets from other nodes for a local pod straight
//! into it with `bpf_redirect_peer`.
#![no_std]
#![no_main]
// Kfunc calls are written as raw instructions (see kfunc.rs).
#![feature(asm_experimental_arch)]

mod flow;
mod kfunc;
mod nat_table;
mod neighbours;
mod nodeport;
mod pod;
mod policy;
mod remote;
mod services;
mod tunnel;
mod uplink;
mod variant;

use aya_ebpf::{
    bindings::{
        BPF_F_NO_PREALLOC, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_SHOT,
        TC_ACT_UNSPEC, bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS, bpf_fib_lookup, bpf_redir_neigh,
        xdp_action,
    },
    btf_maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    helpers::generated::{
        bpf_check_mtu, bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh, bpf_redirect_peer,
    },
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};
use core::mem::size_of;
use flatnet_common::{
    Counter, ENDPOINT_F_SHAPED_INGRESS, Endpoint, EndpointCounters, FAST_PATH_MARK, Ipv4Key,
    Ipv6Key, NO_COUNTER_SLOT, PodSources, REMOTE_F_TUNNEL, RemoteCidrV4, RemoteCidrV6, RemoteNode,
    SOURCES_F_MORE, SOURCES_F_SHAPED_EGRESS, SOURCES_F_VALID, SOURCES_PER_FAMILY, TunnelConfig,
    action, maps, nodeport_call, preferred_slot,
};
use flow::{Conntrack, Flow, IPPROTO_ICMPV6, IPPROTO_TCP};
use neighbours::arp;
use network_types::{
    arp::ArpHdr,
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};
use pod::{Sender, frame};
use remote::route_to_remote;
use tunnel::TunnelSource;
use uplink::{Arrival, Uplink, uplink_to_pod};

// The maps, each sized by and checked against its spec in
// `flatnet_common::maps` (the loader checks pinned maps against the same).

/// Local pods by IPv4 address.
#[btf_map]
static ENDPOINTS_V4: HashMap<Ipv4Key, Endpoint, { maps::ENDPOINTS_V4.max_entries as usize }> =
    HashMap::new();
const _: () = assert!(maps::ENDPOINTS_V4.holds::<Ipv4Key, Endpoint>());

/// Local pods by IPv6 address.
#[btf_map]
static ENDPOINTS_V6: HashMap<Ipv6Key, Endpoint, { maps::ENDPOINTS_V6.max_entries as usize }> =
    HashMap::new();
const _: () = assert!(maps::ENDPOINTS_V6.holds::<Ipv6Key, Endpoint>());

/// The pod behind each host veth, by the veth's ifindex: who is asking when
/// a frame arrives (neighbour answers need the host veth's MAC).
#[btf_map]
static HOST_VETHS: HashMap<u32, Endpoint, { maps::HOST_VETHS.max_entries as usize }> =
    HashMap::new();
const _: () = assert!(maps::HOST_VETHS.holds::<u32, Endpoint>());

/// Per-CPU packet/byte counters, indexed by `flatnet_common::action`.
#[btf_map]
static STATS: PerCpuArray<Counter, { maps::STATS.max_entries as usize }> = PerCpuArray::new();
const _: () = assert!(maps::STATS.holds::<u32, Counter>());

/// Per-CPU traffic of each pod, by its `counter_slot`.
#[btf_map]
static ENDPOINT_STATS: PerCpuArray<
    EndpointCounters,
    { maps::ENDPOINT_STATS.max_entries as usize },
> = PerCpuArray::new();
const _: () = assert!(maps::ENDPOINT_STATS.holds::<u32, EndpointCounters>());

/// Each pod's own addresses by counter slot: the source check.
#[btf_map]
static POD_SOURCES: Array<PodSources, { maps::POD_SOURCES.max_entries as usize }> = Array::new();
const _: () = assert!(maps::POD_SOURCES.holds::<u32, PodSources>());

/// Other nodes' IPv4 pod CIDRs: packets for them take the fast path.
#[btf_map]
static REMOTE_CIDRS_V4: LpmTrie<
    RemoteCidrV4,
    RemoteNode,
    { maps::REMOTE_CIDRS_V4.max_entries as usize },
> = LpmTrie::new();
const _: () = assert!(maps::REMOTE_CIDRS_V4.holds::<Key<RemoteCidrV4>, RemoteNode>());

/// Other nodes' IPv6 pod CIDRs.
#[btf_map]
static REMOTE_CIDRS_V6: LpmTrie<
    RemoteCidrV6,
    RemoteNode,
    { maps::REMOTE_CIDRS_V6.max_entries as usize },
> = LpmTrie::new();
const _: () = assert!(maps::REMOTE_CIDRS_V6.holds::<Key<RemoteCidrV6>, RemoteNode>());

/// The addresses of the other nodes routed directly on the uplink: a TCP
/// flow one of them opens to a local pod takes the fast path both ways
/// (`uplink_to_pod`, `pod::ipv4`). Not preallocated: a node has a few
/// peers, not 16,384, and map memory counts against the agent's limit.
#[btf_map]
static PEER_NODES_V4: HashMap<
    Ipv4Key,
    u32,
    { maps::PEER_NODES_V4.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::PEER_NODES_V4.holds::<Ipv4Key, u32>());

#[btf_map]
static PEER_NODES_V6: HashMap<
    Ipv6Key,
    u32,
    { maps::PEER_NODES_V6.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::PEER_NODES_V6.holds::<Ipv6Key, u32>());

/// The node's VXLAN device (entry 0; all zero: none), written by the agent.
#[btf_map]
static TUNNEL: Array<TunnelConfig, { maps::TUNNEL.max_entries as usize }> = Array::new();
const _: () = assert!(maps::TUNNEL.holds::<u32, TunnelConfig>());

/// Whether `from_uplink` may hand packets to pods: set by the loader (1 in
/// tc mode, 0 in XDP mode; see `flatnet_common::GLOBAL_UPLINK_TO_PODS`).
/// XDP mode sends every packet for another node through the host stack, so
/// the replies must take the stack too, or its conntrack would see half of
/// each flow.
#[unsafe(no_mangle)]
static UPLINK_TO_PODS: u32 = 1;

pub(crate) const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
/// `skb->pkt_type` of a frame addressed to this host (linux/if_packet.h).
const PACKET_HOST: u32 = 0;

/// What to do with a frame; MACs are already rewritten when it leaves.
enum Decision {
    /// To the host stack.
    Pass,
    /// To the host stack, which translated the flow and must undo it.
    Translated,
    /// To the host stack, which tracks the flow.
    Tracked,
    /// Dropped: a source address the pod does not own, or an IP header too
    /// short to tell.
    Drop,
    /// Into the pod behind host veth `host_ifindex`; `slot`: its counters.
    ToPod { host_ifindex: u32, slot: u32 },
    /// Back out of the veth it came from (a neighbour answer).
    Bounce,
    /// To another node's pod: routed by the caller, or passed to the stack.
    Remote,
    /// To another node's own address, of a TCP flow the host never saw
    /// (one that node opened, `from_uplink` took past the stack): a
    /// reply of the NodePort path's flow goes back that way
    /// (`nodeport_reply`), the rest is routed like `Remote`.
    PeerNode,
    /// To a pod of a node reached through the VXLAN tunnel: encapsulated by
    /// the caller, or passed to the stack (which routes it into the tunnel).
    Tunnel,
    /// To another node's pod, of a kind only the stack may judge.
    RemoteToStack,
    /// A local backend's reply of a flow the NodePort path translated
    /// keeping its client's address (its flow's kept verdict): translated
    /// back and sent on by `nodeport_reply`; the stack's if that flow has
    /// gone.
    NodePortReply,
    /// To the host stack, where a qdisc shapes the sender's or the
    /// receiver's traffic (the bandwidth plugin).
    Shaped,
    /// Dropped by NetworkPolicy: the sender's egress or the local
    /// receiver's ingress (counted per pod in `POLICY_DROPS`).
    Denied,
}

/// What a tc program returns to hand a frame on to the host stack: "next"
/// (`TCX_NEXT`, `TC_ACT_UNSPEC`), not "pass" (`TCX_PASS`, `TC_ACT_OK`), so
/// that what else sits on the hook after flatnet still runs: later tcx
/// programs, and the legacy qdisc's filters (the bandwidth plugin's
/// `ingress` qdisc, which shapes a pod's egress), which tcx runs only after
/// a "next" from the last program.
const TC_NEXT: i32 = TC_ACT_UNSPEC;

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    match variant::current() {
        flatnet_common::cost_variant::RETURN => return TC_NEXT,
        flatnet_common::cost_variant::REDIRECT_ONLY => return variant::redirect_only(&ctx),
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
            if nodeport::any_listening() {
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
            if nodeport::any_listening() {
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
            if nodeport::any_listening() {
                nodeport::reply_or(&ctx, nodeport::NotReply::ToPeerNode);
            }
            routed(&ctx, ingress, action::TO_PEER_NODE)
        }
        Decision::Tunnel => tunnelled(&ctx),
    }
}

/// A pod's packet for a tunnelled node's pod into the VXLAN device, or to
/// the stack when `tunnel::send` cannot.
#[inline(always)]
fn tunnelled(ctx: &TcContext) -> i32 {
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

/// Tail-called by `from_pod` for a packet it hands to the stack or routes
/// to another node's address: a local backend's reply of a flow the uplink
/// translated goes back to the client; the rest goes where `from_pod`
/// would have sent it (`nodeport::NotReply`).
#[classifier]
pub fn nodeport_reply(ctx: TcContext) -> i32 {
    if let Some(verdict) = nodeport::reply_from_pod(&ctx) {
        return sent_on(&ctx, verdict);
    }
    match nodeport::not_reply(&ctx) {
        nodeport::NotReply::ToStack => TC_NEXT,
        nodeport::NotReply::ToPeerNode => routed_to_peer_node(&ctx),
    }
}

/// The NodePort path's verdict on a translated packet, the tunnel's when
/// the path left the packet to it (`nodeport::TO_TUNNEL`).
#[inline(always)]
fn sent_on(ctx: &TcContext, verdict: i32) -> i32 {
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
fn routed_to_peer_node(ctx: &TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let ingress = unsafe { (*ctx.skb.skb).ifindex };
    routed(ctx, ingress, action::TO_PEER_NODE)
}

/// A pod's packet for another node, sent the way the FIB says
/// (`route_to_remote`, counted as `sent`), or to the stack when it has no
/// usable answer.
#[inline(always)]
fn routed(ctx: &TcContext, ingress: u32, sent: u32) -> i32 {
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
    if nodeport::candidate(ctx.data(), ctx.data_end()) {
        // SAFETY: a tail call; on failure (no entry) it returns here.
        unsafe { nodeport::NODEPORT_CALLS.tail_call(&ctx, nodeport_call::IN) };
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
    if let Some(verdict) = nodeport::from_outside(&ctx, uplink) {
        return sent_on(&ctx, verdict);
    }
    // SAFETY: a tail call; on failure (no entry) it returns here.
    unsafe { nodeport::NODEPORT_CALLS.tail_call(&ctx, nodeport_call::UPLINK_DELIVER) };
    TC_NEXT
}

/// `from_uplink`'s work for a packet `nodeport_in` did not take.
#[classifier]
pub fn uplink_deliver(ctx: TcContext) -> i32 {
    deliver(&ctx, Arrival::Uplink, action::FROM_UPLINK)
}

/// tc ingress of the node's VXLAN device: a decapsulated packet whose
/// inner source is a pod CIDR address of another node than the one that
/// sent it is dropped (whatever it is for); one from the sending node's
/// pod for a local pod goes straight into the pod; the rest is the host's.
#[classifier]
pub fn from_tunnel(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    if unsafe { (*ctx.skb.skb).pkt_type } != PACKET_HOST {
        return TC_NEXT;
    }
    match tunnel::source(&ctx) {
        TunnelSource::PeerPod => deliver(&ctx, Arrival::Tunnel, action::TUNNEL_TO_POD),
        TunnelSource::Refused => {
            count(action::TUNNEL_SOURCE_REFUSED, ctx.len());
            TC_ACT_SHOT as i32
        }
        TunnelSource::Other => TC_NEXT,
    }
}

/// A packet from another node's pod straight into the local pod it is
/// for, unless the host must see it (`uplink_to_pod`) or the pod's ingress
/// policy refuses it; `delivered`: the `STATS` action it counts as.
#[inline(always)]
fn deliver(ctx: &TcContext, arrival: Arrival, delivered: u32) -> i32 {
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

/// The map entry read once, into the program's stack: a hash map slot can
/// be reused by a concurrent update, and a plain copy would let the compiler
/// read the fields from the map later (and, not knowing the slot from the
/// packet, copy MACs with a `memmove` call).
#[inline(always)]
fn snapshot(entry: &Endpoint) -> Endpoint {
    // SAFETY: `entry` is a valid, aligned map value for the program's run.
    unsafe { core::ptr::read_volatile(entry) }
}

/// One routing hop: TTL minus one, header checksum patched as the kernel's
/// `ip_decrease_ttl` does (RFC 1624: the TTL is the high byte of its word).
#[inline(always)]
fn decrement_ttl(ip: &mut Ipv4Hdr) {
    let sum = u32::from(u16::from_be_bytes(ip.check)) + 0x0100;
    let sum = sum + u32::from(sum >= 0xffff);
    ip.check = (sum as u16).to_be_bytes();
    ip.ttl -= 1;
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
    if nodeport::any_listening() {
        nodeport::reply_or(&ctx, nodeport::NotReply::ToStack);
    }
    TC_NEXT
}

#[xdp]
pub fn pod_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
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

/// Which side of a pod's counters a frame goes to.
enum Direction {
    /// Sent by the pod.
    Tx,
    /// Delivered to the pod by the datapath.
    Rx,
}

#[inline(always)]
fn count_pod(slot: u32, direction: Direction, len: u32) {
    if slot == NO_COUNTER_SLOT || variant::without(flatnet_common::cost_variant::NO_COUNTERS) {
        return;
    }
    if let Some(counters) = ENDPOINT_STATS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            match direction {
                Direction::Tx => {
                    (*counters).tx_packets += 1;
                    (*counters).tx_bytes += u64::from(len);
                }
                Direction::Rx => {
                    (*counters).rx_packets += 1;
                    (*counters).rx_bytes += u64::from(len);
                }
            }
        }
    }
}

#[inline(always)]
fn count(what: u32, len: u32) {
    if variant::without(flatnet_common::cost_variant::NO_COUNTERS) {
        return;
    }
    if let Some(counter) = STATS.get_ptr_mut(what) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(len);
        }
    }
}

/// `*value` set to all zeroes a word at a time. `mem::zeroed` compiles to
/// a call of a `memset` that stores one byte per loop round here (64
/// rounds for a FIB lookup's parameters, on every routed packet).
/// `T` must be a plain-integer struct for which all-zero is valid.
#[inline(always)]
fn zero_words<T>(value: *mut T) {
    const {
        assert!(size_of::<T>() % 4 == 0 && align_of::<T>() >= 4);
    }
    for i in 0..size_of::<T>() / 4 {
        // SAFETY: word `i` of `*value`, which is aligned and this long.
        unsafe { core::ptr::write_volatile(value.cast::<u32>().add(i), 0) };
    }
}

/// A pointer to a `T` at `offset` into the packet, if the packet is long enough.
#[inline(always)]
fn header_at<T>(start: usize, end: usize, offset: usize) -> Result<*mut T, ()> {
    if start + offset + size_of::<T>() > end {
        return Err(());
    }
    Ok((start + offset) as *mut T)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

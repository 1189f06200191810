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

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, TC_ACT_SHOT,
        bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS, bpf_fib_lookup, bpf_redir_neigh, xdp_action,
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
    Counter, Endpoint, EndpointCounters, Ipv4Key, Ipv6Key, NO_COUNTER_SLOT, PodSources,
    RemoteCidrV4, RemoteCidrV6, RemoteNode, SOURCES_F_MORE, SOURCES_F_VALID, SOURCES_PER_FAMILY,
    action, maps,
};
use flow::{Conntrack, Flow, IPPROTO_ICMPV6};
use network_types::{
    arp::ArpHdr,
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

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

/// Whether `from_uplink` may hand packets to pods: set by the loader (1 in
/// tc mode, 0 in XDP mode; see `flatnet_common::GLOBAL_UPLINK_TO_PODS`).
/// XDP mode sends every packet for another node through the host stack, so
/// the replies must take the stack too, or its conntrack would see half of
/// each flow.
#[unsafe(no_mangle)]
static UPLINK_TO_PODS: u32 = 1;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const ARPHRD_ETHER: u16 = 1;
const ARPOP_REQUEST: u16 = 1;
const ARPOP_REPLY: u16 = 2;
const ND_NEIGHBOR_SOLICIT: u8 = 135;
const ND_NEIGHBOR_ADVERT: u8 = 136;
const ND_OPT_SOURCE_LL: u8 = 1;
const ND_OPT_TARGET_LL: u8 = 2;
/// Solicited and Override flags of a neighbour advertisement.
const NA_FLAGS_SOLICITED_OVERRIDE: u8 = 0x60;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `skb->pkt_type` of a frame addressed to this host (linux/if_packet.h).
const PACKET_HOST: u32 = 0;
/// Traffic class and flow label of the first IPv6 header word (network order).
const IPV6_FLOWINFO_MASK: u32 = 0x0fff_ffff_u32.to_be();

/// A neighbour solicitation carrying the sender's link-layer address: the
/// only shape answered here (and exactly the size of the answer, so the
/// frame is rewritten in place).
#[repr(C)]
struct NeighbourMessage {
    icmp_type: u8,
    code: u8,
    checksum: [u8; 2],
    flags: [u8; 4],
    target: [u8; 16],
    option_type: u8,
    option_len: u8,
    link_addr: [u8; 6],
}
const ND_LEN: usize = size_of::<NeighbourMessage>();

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
    /// To another node's pod, of a kind only the stack may judge.
    RemoteToStack,
}

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let (ingress, ingress_slot) = unsafe { ((*ctx.skb.skb).ifindex, (*ctx.skb.skb).tc_classid) };
    // The filter's classid is the sending pod's counter slot (cls_bpf sets
    // tc_classid to it before running us): its counters without a lookup.
    match decide(
        &ctx,
        ctx.data(),
        ctx.data_end(),
        ingress,
        ingress_slot,
        ctx.len(),
    ) {
        Decision::Pass | Decision::Translated | Decision::Tracked | Decision::RemoteToStack => {
            TC_ACT_OK as i32
        }
        Decision::Drop => TC_ACT_SHOT as i32,
        // SAFETY: plain helper call; a stale ifindex makes the kernel drop
        // the frame (with flags 0 the helper itself never fails).
        Decision::ToPod { host_ifindex, .. } => {
            (unsafe { bpf_redirect_peer(host_ifindex, 0) }) as i32
        }
        // SAFETY: plain helper call: egress of the same veth, back to the pod.
        Decision::Bounce => (unsafe { bpf_redirect(ingress, 0) }) as i32,
        Decision::Remote => match route_to_remote(&ctx, ingress) {
            Some(verdict) => {
                count(action::TO_REMOTE_NODE, ctx.len());
                verdict
            }
            None => {
                count(action::REMOTE_PASSED, ctx.len());
                TC_ACT_OK as i32
            }
        },
    }
}

/// tc ingress of the node's uplink: a packet from another node (or from
/// anywhere) for a local pod goes straight into the pod; the rest is the
/// host's.
#[classifier]
pub fn from_uplink(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    if unsafe { (*ctx.skb.skb).pkt_type } != PACKET_HOST {
        return TC_ACT_OK as i32;
    }
    // SAFETY: a read of a constant the loader set (frozen .rodata).
    if unsafe { core::ptr::read_volatile(&UPLINK_TO_PODS) } == 0 {
        return TC_ACT_OK as i32;
    }
    let len = ctx.len();
    let (host_ifindex, slot) = match uplink_to_pod(&ctx, ctx.data(), ctx.data_end()) {
        Uplink::ToPod { host_ifindex, slot } => (host_ifindex, slot),
        Uplink::ToStack(what) => {
            count(what, len);
            return TC_ACT_OK as i32;
        }
        Uplink::Pass => return TC_ACT_OK as i32,
    };
    // SAFETY: plain helper call; a stale ifindex makes the kernel drop the
    // frame (with flags 0 the helper itself never fails).
    let verdict = unsafe { bpf_redirect_peer(host_ifindex, 0) } as i32;
    count(action::FROM_UPLINK, len);
    count_pod(slot, Direction::Rx, len);
    verdict
}

/// Where a frame from the uplink goes.
enum Uplink {
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
fn uplink_to_pod(ct: &impl Conntrack, start: usize, end: usize) -> Uplink {
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
            if ip.ttl <= 1 || REMOTE_CIDRS_V4.get(&Key::new(32, ip.src_addr)).is_none() {
                return Uplink::Pass;
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
            if ip.hop_limit <= 1 || REMOTE_CIDRS_V6.get(&Key::new(128, ip.src_addr)).is_none() {
                return Uplink::Pass;
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

/// Sends a pod's packet for another node the way the kernel's FIB says
/// (the agent's route via that node), with the next hop's MAC the FIB
/// found, or, when it has none yet, resolved by `bpf_redirect_neigh`.
/// None: the host stack must take it (no route, forwarding off, TTL
/// expiring, too big for the way out).
#[inline(always)]
fn route_to_remote(ctx: &TcContext, ingress: u32) -> Option<i32> {
    let (start, end) = (ctx.data(), ctx.data_end());
    let eth: *mut EthHdr = header_at(start, end, 0).ok()?;
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut params: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    // tot_len stays 0: the kernel then checks the skb against the way
    // out's MTU itself, GSO-aware.
    params.ifindex = ingress;
    // SAFETY: `header_at` checked the header lies inside the packet.
    let family = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let ip: *const Ipv4Hdr = header_at(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            if ip.ttl <= 1 {
                return None;
            }
            params.family = AF_INET;
            params.l4_protocol = ip.proto;
            params.__bindgen_anon_2.tos = ip.tos;
            params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(ip.src_addr);
            params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(ip.dst_addr);
            AF_INET
        }
        ETH_P_IPV6 => {
            let ip: *const Ipv6Hdr = header_at(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            if ip.hop_limit <= 1 {
                return None;
            }
            params.family = AF_INET6;
            params.l4_protocol = ip.next_hdr;
            params.__bindgen_anon_2.flowinfo = u32::from_ne_bytes(ip.vcf) & IPV6_FLOWINFO_MASK;
            params.__bindgen_anon_3.ipv6_src = words(ip.src_addr);
            params.__bindgen_anon_4.ipv6_dst = words(ip.dst_addr);
            AF_INET6
        }
        _ => return None,
    };
    // SAFETY: the skb pointer and a params struct of the size given.
    let found = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            &mut params,
            size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    if found == i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
        // The way out and the next hop are known, the next hop's MAC not
        // yet: bpf_redirect_neigh resolves it as the stack would. The FIB
        // checks the MTU only on SUCCESS, so it is checked here (GSO-aware).
        let mut mtu_len: u32 = 0;
        // SAFETY: the skb pointer and a u32 the helper writes the MTU to.
        let fits =
            unsafe { bpf_check_mtu(ctx.skb.skb as *mut _, params.ifindex, &mut mtu_len, 0, 0) };
        if fits != i64::from(BPF_MTU_CHK_RET_SUCCESS) {
            return None;
        }
    } else if found != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return None;
    }
    // Only now, when the packet is surely forwarded here, is it changed.
    if family == AF_INET {
        let ip: *mut Ipv4Hdr = header_at(start, end, EthHdr::LEN).ok()?;
        // SAFETY: bounds checked by `header_at`; the frame is writable.
        decrement_ttl(unsafe { &mut *ip });
    } else {
        let ip: *mut Ipv6Hdr = header_at(start, end, EthHdr::LEN).ok()?;
        // SAFETY: as above.
        unsafe { (*ip).hop_limit -= 1 };
    }
    if found == i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        // The FIB resolved the next hop's MAC too: write the frame as the
        // stack would and send it, without a second neighbour lookup.
        // SAFETY: bounds checked above; the frame is writable.
        unsafe {
            (*eth).dst_addr = params.dmac;
            (*eth).src_addr = params.smac;
        }
        // SAFETY: plain helper call: egress of the way out.
        return Some(unsafe { bpf_redirect(params.ifindex, 0) } as i32);
    }
    // SAFETY: all-zero is a valid bpf_redir_neigh.
    let mut next_hop: bpf_redir_neigh = unsafe { core::mem::zeroed() };
    // The FIB may answer an IPv4 route with an IPv6 next hop (RFC 5549).
    next_hop.nh_family = u32::from(params.family);
    // SAFETY: reading the union member the FIB filled in for this family.
    unsafe {
        if params.family == AF_INET {
            next_hop.__bindgen_anon_1.ipv4_nh = params.__bindgen_anon_4.ipv4_dst;
        } else {
            next_hop.__bindgen_anon_1.ipv6_nh = params.__bindgen_anon_4.ipv6_dst;
        }
    }
    // SAFETY: a next-hop struct of the size given.
    let verdict = unsafe {
        bpf_redirect_neigh(
            params.ifindex,
            &mut next_hop,
            size_of::<bpf_redir_neigh>() as i32,
            0,
        )
    };
    Some(verdict as i32)
}

/// An IPv6 address as the four 32-bit words the FIB helper takes.
#[inline(always)]
fn words(address: [u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([address[0], address[1], address[2], address[3]]),
        u32::from_ne_bytes([address[4], address[5], address[6], address[7]]),
        u32::from_ne_bytes([address[8], address[9], address[10], address[11]]),
        u32::from_ne_bytes([address[12], address[13], address[14], address[15]]),
    ]
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
    // XDP has no per-attachment value like tc's classid: look the sender up.
    // SAFETY: copied at once, before any update can reuse the slot.
    let ingress_slot =
        unsafe { HOST_VETHS.get(ingress) }.map_or(NO_COUNTER_SLOT, |me| me.counter_slot);
    match decide(
        &ctx,
        start,
        end,
        ingress,
        ingress_slot,
        (end - start) as u32,
    ) {
        Decision::Pass | Decision::Translated | Decision::Tracked | Decision::RemoteToStack => {
            xdp_action::XDP_PASS
        }
        Decision::Drop => xdp_action::XDP_DROP,
        // SAFETY: plain helper call: transmit on the destination's host veth,
        // which hands the frame to its peer, the destination pod.
        Decision::ToPod { host_ifindex, .. } => (unsafe { bpf_redirect(host_ifindex, 0) }) as u32,
        Decision::Bounce => xdp_action::XDP_TX,
        // bpf_redirect_neigh is tc-only: the stack routes it in XDP mode.
        Decision::Remote => {
            count(action::REMOTE_PASSED, end.saturating_sub(start) as u32);
            xdp_action::XDP_PASS
        }
    }
}

#[xdp]
pub fn pod_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[inline(always)]
fn decide(
    ct: &impl Conntrack,
    start: usize,
    end: usize,
    ingress: u32,
    ingress_slot: u32,
    len: u32,
) -> Decision {
    count_pod(ingress_slot, Direction::Tx, len);
    let sender = Sender {
        ifindex: ingress,
        slot: ingress_slot,
    };
    let decision = frame(ct, start, end, sender);
    match decision {
        Decision::Pass => count(action::PASSED, len),
        Decision::Translated => count(action::TRANSLATED, len),
        Decision::Tracked => count(action::TRACKED, len),
        Decision::Drop => count(action::DROPPED, len),
        Decision::RemoteToStack => count(action::REMOTE_PASSED, len),
        Decision::ToPod { slot, .. } => {
            count(action::REDIRECTED, len);
            count_pod(slot, Direction::Rx, len);
        }
        // Counted by the program that routes it.
        Decision::Bounce | Decision::Remote => {}
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
    if slot == NO_COUNTER_SLOT {
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
fn frame(ct: &impl Conntrack, start: usize, end: usize, sender: Sender) -> Decision {
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

/// The pod a frame comes from: its host veth and its counter slot.
#[derive(Clone, Copy)]
struct Sender {
    ifindex: u32,
    slot: u32,
}

/// What the sender's `POD_SOURCES` entry says of a source address.
enum Owned {
    Yes,
    No,
    /// No entry (an older build's pod) or not all addresses in it.
    Unknown,
}

/// Looks `address` up among the sender's own addresses (`pick` chooses
/// the family's list in its entry). Field by field, in place: a copy of the
/// whole entry would not fit the program's stack.
#[inline(always)]
fn owned_by<const N: usize>(
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
struct Target {
    local: bool,
    peer: Endpoint,
}

impl Target {
    #[inline(always)]
    fn pod(peer: Endpoint) -> Self {
        Target { local: true, peer }
    }

    #[inline(always)]
    fn remote() -> Self {
        Target {
            local: false,
            peer: Endpoint::default(),
        }
    }
}

/// A pod's IPv4 packet: dropped unless it comes from one of the pod's own
/// addresses; to another pod on the fast path unless the host stack tracks
/// its flow.
#[inline(always)]
fn ipv4(
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
        None if REMOTE_CIDRS_V4.get(&Key::new(32, dst)).is_some() => Target::remote(),
        None => return Decision::Pass,
    };
    fast_path(flow::ipv4(ct, start, end, ip), target, eth)
}

/// The fast path's answer for a packet to `target`, given what the host
/// stack has to say about its flow.
#[inline(always)]
fn fast_path(judged: Flow, target: Target, eth: *mut EthHdr) -> Decision {
    match (judged, target.local) {
        (Flow::Translated, _) => Decision::Translated,
        (Flow::Tracked, _) => Decision::Tracked,
        (Flow::Opaque, true) => Decision::Pass,
        (Flow::Opaque, false) => Decision::RemoteToStack,
        (Flow::Clear, true) => to_pod(eth, target.peer),
        (Flow::Clear, false) => Decision::Remote,
    }
}

#[inline(always)]
fn host_ifindex(entry: &Endpoint) -> u32 {
    // SAFETY: a valid, aligned map value for the program's run.
    unsafe { core::ptr::read_volatile(&entry.host_ifindex) }
}

/// Rewrites the frame for the destination pod: it must see a frame
/// addressed to it, coming from its host veth (its only neighbour), as if
/// the host had routed it.
#[inline(always)]
fn to_pod(eth: *mut EthHdr, peer: Endpoint) -> Decision {
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
enum Source {
    /// One of the pod's addresses.
    Owned,
    /// Link-local, or unspecified (duplicate address detection), to a
    /// destination on the link: the host's to answer, never forwarded.
    Link,
    /// Anything else: dropped.
    Foreign,
}

#[inline(always)]
fn is_link_local(address: &[u8; 16]) -> bool {
    address[0] == 0xfe && address[1] & 0xc0 == 0x80
}

#[inline(always)]
fn is_multicast(address: &[u8; 16]) -> bool {
    address[0] == 0xff
}

#[inline(always)]
fn source_v6(ip: &Ipv6Hdr, sender: Sender) -> Source {
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
fn ipv6(
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
        None if REMOTE_CIDRS_V6.get(&Key::new(128, dst)).is_some() => Target::remote(),
        None => return Decision::Pass,
    };
    fast_path(flow::ipv6(ct, start, end, header), target, eth)
}

/// Answers a pod's ARP request with the MAC of its host veth, so the pod
/// sends everything (other pods, gateway, outside) to this program.
#[inline(always)]
fn arp(start: usize, end: usize, eth: *mut EthHdr, ingress: u32) -> Result<Decision, ()> {
    let arp: *mut ArpHdr = header_at(start, end, EthHdr::LEN)?;
    // SAFETY: bounds checked by `header_at`.
    let req = unsafe { &mut *arp };
    if u16::from_be_bytes(req.htype) != ARPHRD_ETHER
        || u16::from_be_bytes(req.ptype) != ETH_P_IP
        || req.hlen != 6
        || req.plen != 4
        || u16::from_be_bytes(req.oper) != ARPOP_REQUEST
    {
        return Ok(Decision::Pass);
    }
    let (sender_ip, target_ip) = (req.spa, req.tpa);
    // Probes (sender 0.0.0.0) and announcements of the pod's own address must
    // stay unanswered, or the pod would believe its address is taken.
    if sender_ip == [0; 4] || sender_ip == target_ip {
        return Ok(Decision::Pass);
    }
    // SAFETY: copied at once, see above.
    let Some(me) = (unsafe { HOST_VETHS.get(ingress) }).map(snapshot) else {
        return Ok(Decision::Pass);
    };
    let pod_mac = req.sha;
    req.oper = ARPOP_REPLY.to_be_bytes();
    req.tha = pod_mac;
    req.tpa = sender_ip;
    req.sha = me.host_mac;
    req.spa = target_ip;
    // SAFETY: bounds checked by the caller.
    unsafe {
        (*eth).dst_addr = pod_mac;
        (*eth).src_addr = me.host_mac;
    }
    count(
        action::ARP_ANSWERED,
        (size_of::<EthHdr>() + size_of::<ArpHdr>()) as u32,
    );
    Ok(Decision::Bounce)
}

/// Turns a pod's neighbour solicitation into the advertisement of the host
/// veth's MAC, in place, as ARP is answered for IPv4.
#[inline(always)]
fn neighbour_solicitation(
    eth: *mut EthHdr,
    ip: &mut Ipv6Hdr,
    nd: *mut NeighbourMessage,
    ingress: u32,
) -> Decision {
    // SAFETY: the caller checked the message lies inside the packet.
    let msg = unsafe { &mut *nd };
    let payload_len = u16::from_be_bytes(ip.payload_len) as usize;
    // Duplicate address detection (source ::) must stay unanswered; and only
    // the usual shape (one source link-layer option) is answered in place.
    if ip.src_addr == [0; 16]
        || ip.hop_limit != 255
        || msg.code != 0
        || payload_len != ND_LEN
        || msg.option_type != ND_OPT_SOURCE_LL
        || msg.option_len != 1
        || msg.target == ip.src_addr
    {
        return Decision::Pass;
    }
    // SAFETY: copied at once, see above.
    let Some(me) = (unsafe { HOST_VETHS.get(ingress) }).map(snapshot) else {
        return Decision::Pass;
    };
    let pod_mac = msg.link_addr;
    ip.dst_addr = ip.src_addr;
    ip.src_addr = msg.target;
    msg.icmp_type = ND_NEIGHBOR_ADVERT;
    msg.flags = [NA_FLAGS_SOLICITED_OVERRIDE, 0, 0, 0];
    msg.option_type = ND_OPT_TARGET_LL;
    msg.link_addr = me.host_mac;
    msg.checksum = [0; 2];
    msg.checksum = icmpv6_checksum(ip, msg).to_be_bytes();
    // SAFETY: bounds checked by the caller.
    unsafe {
        (*eth).dst_addr = pod_mac;
        (*eth).src_addr = me.host_mac;
    }
    count(
        action::ND_ANSWERED,
        (size_of::<EthHdr>() + Ipv6Hdr::LEN + ND_LEN) as u32,
    );
    Decision::Bounce
}

/// The ICMPv6 checksum of `msg` (checksum field zero) under `ip`'s pseudo-header.
#[inline(always)]
fn icmpv6_checksum(ip: &Ipv6Hdr, msg: &NeighbourMessage) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        let mut i = 0;
        while i + 1 < bytes.len() {
            sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
            i += 2;
        }
    };
    add(&ip.src_addr);
    add(&ip.dst_addr);
    // SAFETY: `msg` is a plain #[repr(C)] struct of bytes, ND_LEN long.
    add(unsafe {
        core::slice::from_raw_parts(msg as *const NeighbourMessage as *const u8, ND_LEN)
    });
    sum += ND_LEN as u32 + u32::from(IPPROTO_ICMPV6);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[inline(always)]
fn count(what: u32, len: u32) {
    if let Some(counter) = STATS.get_ptr_mut(what) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(len);
        }
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

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

use aya_ebpf::{
    bindings::{
        BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_FIB_LOOKUP_OUTPUT, BPF_FIB_LOOKUP_SKIP_NEIGH,
        BPF_FIB_LOOKUP_SRC, BPF_NOEXIST,
    },
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray},
    helpers::generated::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns},
    macros::btf_map,
    programs::TcContext,
};
use flatnet_common::{
    AffinityKey, BackendKey, Endpoint, FRONTEND_F_EXTERNAL, FRONTEND_F_KEEP_CLIENT, FragmentKey,
    FragmentKey6, FragmentPorts, NAT_F_CLIENT_KEPT, NAT_F_CLOSING, NAT_F_LOCAL_SOURCE, NAT_F_RESET,
    NAT_PORT_MAX, NAT_PORT_MIN, NatForward, NatKey, NatReverse, NodePortAddress, ServiceBackend,
    ServiceKey, ServiceValue, external_port, maps,
};

use crate::nat_table::NAT_REVERSE;
use crate::remote::{take_hop, words};
use crate::services::{SERVICE_BACKENDS, SERVICES, affinity_index};
use crate::*;

mod icmp;

/// Which protocols' frontends listen on each port (`external_port` bits).
#[btf_map]
static EXTERNAL_PORTS: Array<u32, { maps::EXTERNAL_PORTS.max_entries as usize }> = Array::new();
const _: () = assert!(maps::EXTERNAL_PORTS.holds::<u32, u32>());

/// The NodePort path's programs, for `from_pod` and `from_uplink` to
/// tail-call (`nodeport_call` indices).
#[btf_map]
pub(crate) static NODEPORT_CALLS: ProgramArray<{ maps::NODEPORT_CALLS.max_entries as usize }> =
    ProgramArray::new();
const _: () = assert!(maps::NODEPORT_CALLS.holds::<u32, u32>());

/// Translated flows by the client's tuple.
#[btf_map]
static NAT_FORWARD: LruHashMap<NatKey, NatForward, { maps::NAT_FORWARD.max_entries as usize }> =
    LruHashMap::new();
const _: () = assert!(maps::NAT_FORWARD.holds::<NatKey, NatForward>());

/// The ports of fragmented datagrams, from their first fragments, for
/// their later ones.
#[btf_map]
static NAT_FRAGMENTS: LruHashMap<
    FragmentKey,
    FragmentPorts,
    { maps::NAT_FRAGMENTS.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::NAT_FRAGMENTS.holds::<FragmentKey, FragmentPorts>());

/// The same for IPv6 datagrams (their fragment header's identification).
#[btf_map]
static NAT_FRAGMENTS6: LruHashMap<
    FragmentKey6,
    FragmentPorts,
    { maps::NAT_FRAGMENTS6.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::NAT_FRAGMENTS6.holds::<FragmentKey6, FragmentPorts>());

/// The source address the kernel picks on the way to a local pod, per
/// family (index 0 IPv4, 1 IPv6), as the last new flow to a local backend
/// found it.
#[btf_map]
static NAT_LOCAL_SOURCES: Array<[u8; 16], { maps::NAT_LOCAL_SOURCES.max_entries as usize }> =
    Array::new();
const _: () = assert!(maps::NAT_LOCAL_SOURCES.holds::<u32, [u8; 16]>());

/// Node ports being taken from spent flows (`take_claimed`).
#[btf_map]
static NAT_CLAIMS: HashMap<NatKey, u32, { maps::NAT_CLAIMS.max_entries as usize }> = HashMap::new();
const _: () = assert!(maps::NAT_CLAIMS.holds::<NatKey, u32>());

/// What the path works on for the packet at hand, per CPU (a program runs
/// to its end on one CPU).
#[repr(C)]
pub(crate) struct Scratch {
    /// The packet's flow.
    key: NatKey,
    /// A new flow's reply tuple.
    reply: NatKey,
    forward: NatForward,
    reverse: NatReverse,
    /// The flow that holds a node port a new flow wants, and its key.
    spent: NatReverse,
    spent_key: NatKey,
    /// Where the packet's transport header starts (an ICMP error's: the
    /// quoted packet's).
    l4: u32,
    /// Where an ICMP error's header starts; 0: the packet is no ICMP error.
    icmp: u32,
    /// Where the quoted packet's transport checksum is, when the error
    /// quotes it and it is in use; 0: not patched.
    quoted_l4_csum: u32,
    /// The quoted packet's IPv4 header and transport checksums before the
    /// error is rewritten.
    quoted_csums: [u16; 2],
    /// What an ICMP error's rewrite makes of it.
    error: icmp::ErrorRewrite,
    /// A fragmented datagram's fragment (`FRAGMENT_*`), and its datagram
    /// (by the key of its family).
    fragment: u32,
    fragment_key: FragmentKey,
    fragment_key6: FragmentKey6,
    /// The `NAT_F_*` flags the packet sets: `NAT_F_CLOSING` for a TCP FIN,
    /// with `NAT_F_RESET` for a RST.
    closing: u32,
    /// 1: the packet opens a TCP connection (a SYN without ACK). On a flow
    /// whose connection is over, its client reused the port (`reopens`).
    opening: u32,
    /// The source a translated flow's packets to its backend are given
    /// (`nat_source`).
    nat_source: [u8; 16],
    /// A FIB lookup's question and answer (`local_masquerade_source`).
    fib: bpf_fib_lookup,
    /// A new flow's backend.
    backend: ServiceBackend,
}

#[btf_map]
static NODEPORT_SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
/// IPv6's fragment header.
const IPPROTO_FRAGMENT: u8 = 44;
/// An IPv6 fragment header: next header, reserved, offset and flags (the
/// offset in 8-byte units in the high 13 bits, "more" in the lowest),
/// identification.
const FRAGMENT_HEADER_LEN: usize = 8;
/// `Scratch::fragment`: a whole datagram; the first fragment of one (its
/// ports are kept for the rest); a later one (no transport header: its
/// ports are the first's).
const FRAGMENT_NONE: u32 = 0;
const FRAGMENT_FIRST: u32 = 1;
const FRAGMENT_LATER: u32 = 2;
const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
/// Free node ports tried for a new flow before it is dropped.
const NAT_PORT_TRIES: u32 = 16;
/// A flow's `last_ns` is written at most this often.
const REFRESH_NS: u64 = 1_000_000_000;
/// A node port held by a TCP flow closed by a FIN, idle this long (one
/// reset, at once), may be given to a new flow: the agent collects such flows only
/// at its resync, and a node port is scarce (4,536 per node address,
/// backend and protocol).
const TCP_CLOSED_REUSE_NS: u64 = 1_000_000_000;
/// The same for a UDP flow idle this long (the kernel's
/// `nf_conntrack_udp_timeout`; the agent forgets it after 120 s).
const UDP_REUSE_NS: u64 = 30_000_000_000;

/// What listens on `port` (host order): its `EXTERNAL_PORTS` entry, both
/// halves together (0: nothing). An array read.
#[inline(always)]
fn listening_on(port: u16) -> u32 {
    EXTERNAL_PORTS.get_ptr(u32::from(port)).map_or(0, |entry| {
        // SAFETY: a valid map value for the program's run; read once.
        external_port::listening(unsafe { core::ptr::read_volatile(entry) })
    })
}

/// Whether a NodePort of IP protocol `protocol` listens on `port` (host
/// order): an array read, before any hash lookup of a node address.
#[inline(always)]
pub(crate) fn nodeport_listens(port: u16, protocol: u8) -> bool {
    listening_on(port) & external_port::nodeport_bit(protocol) != 0
}

/// Whether any frontend listens for clients outside the node (NodePort,
/// external address, hostPort): only then can a pod's packet be the reply
/// of a translated flow.
#[inline(always)]
pub(crate) fn any_listening() -> bool {
    listening_on(external_port::ANY_PORT) != 0
}

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

/// `from_uplink`'s question, asked before anything else: may the packet
/// be the NodePort path's (a TCP or UDP destination port that a frontend
/// outside clients reach listens on, or one translated flows are given)?
/// Headers read in place, nothing kept: `from_uplink`'s stack is full.
#[inline(always)]
pub(crate) fn candidate(start: usize, end: usize) -> bool {
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return false;
    };
    // SAFETY: `header_at` checked the header lies inside the packet.
    let (protocol, l4) = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
                return false;
            };
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            if ip.vihl != 0x45 {
                return false;
            }
            // A later fragment has no ports to ask about: parse tells.
            if u16::from_be_bytes(ip.frags) & 0x1fff != 0 {
                return any_listening();
            }
            (ip.proto, EthHdr::LEN + Ipv4Hdr::LEN)
        }
        ETH_P_IPV6 => {
            let Ok(ip) = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN) else {
                return false;
            };
            let l4 = EthHdr::LEN + Ipv6Hdr::LEN;
            // SAFETY: bounds checked by `header_at`.
            match unsafe { (*ip).next_hdr } {
                IPPROTO_FRAGMENT => {
                    let Ok(fragment) = header_at::<[u8; 4]>(start, end, l4) else {
                        return false;
                    };
                    // SAFETY: bounds checked by `header_at`.
                    let fragment = unsafe { *fragment };
                    // A later fragment: as over IPv4.
                    if u16::from_be_bytes([fragment[2], fragment[3]]) & 0xfff8 != 0 {
                        return any_listening();
                    }
                    (fragment[0], l4 + FRAGMENT_HEADER_LEN)
                }
                next => (next, l4),
            }
        }
        _ => return false,
    };
    // An ICMP error may be about a translated flow's packet (parse tells).
    if protocol == IPPROTO_ICMP || protocol == IPPROTO_ICMPV6 {
        return any_listening();
    }
    if protocol != IPPROTO_TCP && protocol != IPPROTO_UDP {
        return false;
    }
    let Ok(ports) = header_at::<[u8; 4]>(start, end, l4) else {
        return false;
    };
    // SAFETY: bounds checked by `header_at`.
    let port = u16::from_be_bytes(unsafe { [(*ports)[2], (*ports)[3]] });
    if port >= NAT_PORT_MIN {
        return true;
    }
    listening_on(port)
        & (external_port::nodeport_bit(protocol) | external_port::address_bit(protocol))
        != 0
}

/// This CPU's scratch area.
#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    // SAFETY: per-CPU: no other program uses this CPU's entry while this
    // one runs.
    NODEPORT_SCRATCH.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

/// Reads the packet's flow into `s`, if it is one the path serves.
#[inline(always)]
fn parse(ctx: &TcContext, s: &mut Scratch) -> Option<()> {
    let (start, end) = (ctx.data(), ctx.data_end());
    let eth: *const EthHdr = header_at(start, end, 0).ok()?;
    let key = &mut s.key;
    // SAFETY: `header_at` checked the header lies inside the packet.
    let l4 = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let ip: *const Ipv4Hdr = header_at(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            // Options: the stack's.
            if ip.vihl != 0x45 {
                return None;
            }
            let frags = u16::from_be_bytes(ip.frags);
            s.fragment = if frags & 0x1fff != 0 {
                FRAGMENT_LATER
            } else if frags & 0x2000 != 0 {
                FRAGMENT_FIRST
            } else {
                FRAGMENT_NONE
            };
            s.fragment_key = FragmentKey {
                src: ip.src_addr,
                dst: ip.dst_addr,
                id: ip.id,
                protocol: ip.proto,
                _pad: 0,
            };
            set_address(&raw mut key.src, ip.src_addr.as_ptr(), 1);
            set_address(&raw mut key.dst, ip.dst_addr.as_ptr(), 1);
            key.protocol = ip.proto;
            key.family = 4;
            EthHdr::LEN + Ipv4Hdr::LEN
        }
        ETH_P_IPV6 => {
            let ip: *const Ipv6Hdr = header_at(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            set_address(&raw mut key.src, ip.src_addr.as_ptr(), 4);
            set_address(&raw mut key.dst, ip.dst_addr.as_ptr(), 4);
            key.protocol = ip.next_hdr;
            key.family = 6;
            s.fragment = FRAGMENT_NONE;
            let l4 = EthHdr::LEN + Ipv6Hdr::LEN;
            if ip.next_hdr == IPPROTO_FRAGMENT {
                parse_fragment_header(ctx, l4, key, &mut s.fragment, &mut s.fragment_key6)?;
                l4 + FRAGMENT_HEADER_LEN
            } else {
                l4
            }
        }
        _ => return None,
    };
    key._pad = [0; 2];
    s.icmp = 0;
    if (key.family == 4 && key.protocol == IPPROTO_ICMP)
        || (key.family == 6 && key.protocol == IPPROTO_ICMPV6)
    {
        if s.fragment != FRAGMENT_NONE {
            return None;
        }
        return icmp::parse_error(ctx, s, l4);
    }
    if s.fragment == FRAGMENT_LATER {
        if key.protocol != IPPROTO_TCP && key.protocol != IPPROTO_UDP {
            return None;
        }
        // Its first fragment's ports, or the stack's (it came first, or
        // the datagram is no flow of the path's).
        let ports = if key.family == 4 {
            NAT_FRAGMENTS.get_ptr(&s.fragment_key)?
        } else {
            NAT_FRAGMENTS6.get_ptr(&s.fragment_key6)?
        };
        // SAFETY: a valid map value for the program's run; read once.
        let ports = unsafe { core::ptr::read_volatile(ports) };
        key.src_port = ports.src_port;
        key.dst_port = ports.dst_port;
        s.closing = 0;
        s.opening = 0;
        s.l4 = l4 as u32;
        return Some(());
    }
    s.opening = 0;
    s.closing = match key.protocol {
        IPPROTO_TCP => {
            let flags: *const u8 = header_at(start, end, l4 + 13).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let flags = unsafe { *flags };
            s.opening = u32::from(flags & (TCP_SYN | TCP_ACK) == TCP_SYN);
            if flags & TCP_RST != 0 {
                NAT_F_CLOSING | NAT_F_RESET
            } else if flags & TCP_FIN != 0 {
                NAT_F_CLOSING
            } else {
                0
            }
        }
        IPPROTO_UDP => 0,
        _ => return None,
    };
    let ports: *const [u8; 4] = header_at(start, end, l4).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let ports = unsafe { *ports };
    key.src_port = [ports[0], ports[1]];
    key.dst_port = [ports[2], ports[3]];
    s.l4 = l4 as u32;
    Some(())
}

/// `address` (a 16-byte address of the scratch area) set to `words` words
/// read from `from` (the packet), the rest zero. Word by word: plain
/// assignments compile to calls of byte-at-a-time `memset`/`memmove`
/// here, on every packet.
#[inline(always)]
fn set_address(address: *mut [u8; 16], from: *const u8, words: usize) {
    for i in 0..4 {
        // SAFETY: `address` lies at a 4-aligned offset of the scratch area
        // (`SCRATCH_ALIGNED`); `from` holds `words` words (the caller's
        // bounds-checked header).
        unsafe {
            let word = if i < words {
                core::ptr::read_unaligned(from.cast::<u32>().add(i))
            } else {
                0
            };
            core::ptr::write_volatile(address.cast::<u32>().add(i), word);
        }
    }
}

/// An IPv6 fragment header at `at` (`key` holding the packet's ends): the
/// fragment it makes the packet (an atomic fragment, offset 0 and no more,
/// is a whole datagram), its datagram's key, and the transport protocol
/// in `key`.
#[inline(never)]
fn parse_fragment_header(
    ctx: &TcContext,
    at: usize,
    key: &mut NatKey,
    fragment: &mut u32,
    datagram: &mut FragmentKey6,
) -> Option<()> {
    let header: [u8; FRAGMENT_HEADER_LEN] = ctx.load(at).ok()?;
    let offset_flags = u16::from_be_bytes([header[2], header[3]]);
    *fragment = if offset_flags & 0xfff8 != 0 {
        FRAGMENT_LATER
    } else if offset_flags & 1 != 0 {
        FRAGMENT_FIRST
    } else {
        FRAGMENT_NONE
    };
    key.protocol = header[0];
    datagram.src = key.src;
    datagram.dst = key.dst;
    datagram.id = [header[4], header[5], header[6], header[7]];
    datagram.protocol = header[0];
    datagram._pad = [0; 3];
    Some(())
}

/// A first fragment's ports, kept for the later fragments of its datagram
/// (once the path has taken the first: a flow of its own).
#[inline(never)]
fn keep_fragment_ports(s: &Scratch) {
    if s.fragment == FRAGMENT_FIRST {
        let ports = FragmentPorts {
            src_port: s.key.src_port,
            dst_port: s.key.dst_port,
        };
        let _ = if s.key.family == 4 {
            NAT_FRAGMENTS.insert(&s.fragment_key, &ports, 0)
        } else {
            NAT_FRAGMENTS6.insert(&s.fragment_key6, &ports, 0)
        };
    }
}

/// `nodeport_in` (tail-called by `from_uplink`): a packet from outside for
/// a frontend, or a reply of a flow translated here, is translated and
/// sent on. None: not the NodePort path's.
#[inline(always)]
pub(crate) fn from_outside(ctx: &TcContext, uplink: u32) -> Option<i32> {
    let s = scratch()?;
    parse(ctx, s)?;
    if s.icmp != 0 {
        // About a translated flow's packet to its client, or to its
        // backend, or the stack's.
        if let Some(flow) = NAT_REVERSE.get_ptr(&s.key) {
            return Some(icmp_error_out(ctx, s, flow));
        }
        let flow = NAT_FORWARD.get_ptr(&s.key)?;
        return Some(icmp_error_in(ctx, s, flow, uplink));
    }
    let port = u16::from_be_bytes(s.key.dst_port);
    if port >= NAT_PORT_MIN {
        if let Some(reply) = NAT_REVERSE.get_ptr_mut(&s.key) {
            keep_fragment_ports(s);
            return Some(reply_out(ctx, s, reply));
        }
    }
    let listening = listening_on(port);
    let protocol = s.key.protocol;
    if listening & (external_port::nodeport_bit(protocol) | external_port::address_bit(protocol))
        == 0
    {
        return None;
    }
    let known = NAT_FORWARD
        .get_ptr_mut(&s.key)
        .filter(|&known| s.opening == 0 || !reopens(s, known));
    match known {
        Some(known) => refresh_forward(s, known),
        // A later fragment starts no flow.
        None if s.fragment == FRAGMENT_LATER => return None,
        None => match new_flow(ctx, s, listening, uplink) {
            FlowStart::Started => {}
            FlowStart::NotOurs => return None,
            FlowStart::Dropped => {
                count(action::NODEPORT_DROPPED, ctx.len());
                return Some(TC_ACT_SHOT as i32);
            }
        },
    }
    keep_fragment_ports(s);
    Some(to_backend(ctx, s, uplink))
}

/// A known flow's translation into `s.forward`, its last use refreshed.
#[inline(never)]
fn refresh_forward(s: &mut Scratch, known: *mut NatForward) {
    // SAFETY: a valid map value for the program's run; read once.
    s.forward = unsafe { core::ptr::read_volatile(known) };
    load_nat_source(s);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let closes = s.closing & !s.forward.flags != 0;
    if now.wrapping_sub(s.forward.last_ns) > REFRESH_NS || closes {
        s.forward.last_ns = now;
        s.forward.flags |= s.closing;
        // SAFETY: as above; racing writers only write a time or a flag.
        unsafe {
            core::ptr::write_volatile(&mut (*known).last_ns, now);
            core::ptr::write_volatile(&mut (*known).flags, s.forward.flags);
        }
    }
    if closes {
        // The way back closes too: its node port may be reused once idle
        // (`take_spent` reads the reverse entry).
        set_reply_of_forward(s);
        if let Some(back) = NAT_REVERSE.get_ptr_mut(&s.reply) {
            // SAFETY: a valid map value for the program's run; racing
            // writers only write a time or a flag.
            unsafe {
                let flags = core::ptr::read_volatile(&(*back).flags);
                core::ptr::write_volatile(&mut (*back).flags, flags | s.closing);
                core::ptr::write_volatile(&mut (*back).last_ns, now);
            }
        }
    }
}

/// `s.reply`: the replies' tuple of the flow in `s.forward` (its client's
/// tuple in `s.key`, its source in `s.nat_source`).
#[inline(always)]
fn set_reply_of_forward(s: &mut Scratch) {
    let translated = s.forward.nat_port != [0; 2];
    s.reply = NatKey {
        src: s.forward.backend,
        dst: if translated { s.nat_source } else { s.key.src },
        src_port: s.forward.backend_port,
        dst_port: if translated {
            s.forward.nat_port
        } else {
            s.key.src_port
        },
        protocol: s.key.protocol,
        family: s.key.family,
        _pad: [0; 2],
    };
}

/// Whether a SYN (`s.opening`) of a known flow (`known`) opens a new
/// connection on its client's tuple: the old one was closed or reset (its
/// flags, either way), or its node port is no longer its own. Then the old
/// flow's forward entry is forgotten and the SYN starts a new flow, as
/// conntrack kills a closed connection's entry when a SYN reopens its tuple
/// and NATs the SYN afresh. Else it is a retransmitted SYN of the flow.
/// (Kept, the old flow's closing flags would mark the new connection's node
/// port spent, and another client's new flow could take it while it is
/// live.) The old reverse entry stays, spent, for a new flow to take: a
/// removal here could remove one another CPU has just written there.
#[inline(never)]
fn reopens(s: &mut Scratch, known: *mut NatForward) -> bool {
    // SAFETY: a valid map value for the program's run; read once.
    s.forward = unsafe { core::ptr::read_volatile(known) };
    load_nat_source(s);
    set_reply_of_forward(s);
    let mut over = s.forward.flags & NAT_F_CLOSING != 0;
    let mut owned = false;
    if let Some(back) = NAT_REVERSE.get_ptr(&s.reply) {
        // SAFETY: a valid map value for the program's run; read once.
        s.spent = unsafe { core::ptr::read_volatile(back) };
        owned = s.spent.client == s.key.src
            && s.spent.client_port == s.key.src_port
            && s.spent.frontend == s.key.dst
            && s.spent.frontend_port == s.key.dst_port;
        over |= s.spent.flags & NAT_F_CLOSING != 0;
    }
    if owned && !over {
        return false;
    }
    let _ = NAT_FORWARD.remove(&s.key);
    true
}

/// What became of a flow's first packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FlowStart {
    /// Given a backend: `s.forward` holds the translation, recorded both ways.
    Started,
    /// For no frontend outside clients reach (the stack's; a frontend
    /// without endpoints, too: nothing listens there, so the stack
    /// refuses it, as kube-proxy's REJECT).
    NotOurs,
    /// Dropped: `externalTrafficPolicy: Local` without a backend here, or
    /// no free node port.
    Dropped,
}

/// The frontend a new flow's first packet is for and the backend it
/// gets; its translation recorded both ways.
#[inline(never)]
fn new_flow(ctx: &TcContext, s: &mut Scratch, listening: u32, uplink: u32) -> FlowStart {
    let flow = &s.key;
    let mut key = ServiceKey {
        address: flow.dst,
        port: flow.dst_port,
        protocol: flow.protocol,
        family: flow.family,
    };
    let Some(frontend) = frontend_for(&mut key, listening) else {
        return FlowStart::NotOurs;
    };
    if frontend.flags & FRONTEND_F_EXTERNAL == 0 || frontend.count == 0 {
        return FlowStart::NotOurs;
    }
    let choices = u32::from(frontend.external_count).min(frontend.count);
    if choices == 0 {
        return FlowStart::Dropped;
    }
    let index = affinity_index(client_of(&flow.src, &key), &frontend, choices);
    let backend_key = BackendKey {
        id: frontend.id,
        index,
    };
    // SAFETY: the value is copied at once.
    let Some(backend) = (unsafe { SERVICE_BACKENDS.get(&backend_key) }) else {
        return FlowStart::NotOurs;
    };
    s.backend = *backend;
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    s.reverse = NatReverse {
        client: flow.src,
        frontend: flow.dst,
        client_port: flow.src_port,
        frontend_port: flow.dst_port,
        ifindex: uplink,
        flags: 0,
        _pad: 0,
        last_ns: now,
    };
    // The reply's tuple: from the backend to the client, or, translated,
    // to the node address on the port found free for it.
    s.reply = NatKey {
        src: s.backend.address,
        dst: flow.src,
        src_port: s.backend.port,
        dst_port: flow.src_port,
        protocol: flow.protocol,
        family: flow.family,
        _pad: [0; 2],
    };
    let mut flags = 0;
    let nat_port = if frontend.flags & FRONTEND_F_KEEP_CLIENT != 0 {
        s.reverse.flags = NAT_F_CLIENT_KEPT;
        // A failed write only leaves the replies untranslated.
        let _ = NAT_REVERSE.insert(&s.reply, &s.reverse, 0);
        // The replies go to the client's own address, maybe a pod of
        // another node, which `from_pod` would route as they are: their
        // flow's kept verdict sends them to `nodeport_reply` instead.
        crate::flow::keep_nodeport_reply(&s.reply);
        [0; 2]
    } else {
        s.reply.dst = s.key.dst;
        if local_masquerade_source(ctx, s, uplink) {
            s.reply.dst = s.nat_source;
            flags = NAT_F_LOCAL_SOURCE;
        }
        match free_port(s) {
            Some(port) => port,
            None => return FlowStart::Dropped,
        }
    };
    s.nat_source = s.reply.dst;
    s.forward = NatForward {
        backend: s.backend.address,
        backend_port: s.backend.port,
        nat_port,
        flags,
        last_ns: now,
    };
    if NAT_FORWARD.insert(&s.key, &s.forward, 0).is_err() {
        let _ = NAT_REVERSE.remove(&s.reply);
        return FlowStart::Dropped;
    }
    FlowStart::Started
}

/// The frontend at the packet's destination: an external address's own
/// entry, or on one of this node's NodePort addresses the NodePort (`key`
/// then holds the wildcard, as affinity keys it).
#[inline(always)]
fn frontend_for(key: &mut ServiceKey, listening: u32) -> Option<ServiceValue> {
    if listening & external_port::address_bit(key.protocol) != 0 {
        // SAFETY: the value is copied at once.
        if let Some(frontend) = unsafe { SERVICES.get(&*key) } {
            return Some(*frontend);
        }
    }
    if listening & external_port::nodeport_bit(key.protocol) == 0 {
        return None;
    }
    let node = NodePortAddress {
        address: key.address,
        family: key.family,
        _pad: [0; 3],
    };
    // SAFETY: only the presence is read.
    unsafe { crate::services::NODEPORT_ADDRS.get(&node) }?;
    if !policy::is_node_address(&key.address, key.family) {
        return None;
    }
    key.address = [0; 16];
    // SAFETY: the value is copied at once.
    unsafe { SERVICES.get(&*key) }.copied()
}

/// sessionAffinity's key of an outside client: its address, in a space of
/// its own (the top bit set; socket clients are network namespace cookies,
/// which count up from 1). IPv6 addresses are folded into 63 bits.
#[inline(always)]
fn client_of(address: &[u8; 16], frontend: &ServiceKey) -> AffinityKey {
    let mut high = [0u8; 8];
    let mut low = [0u8; 8];
    high.copy_from_slice(&address[..8]);
    low.copy_from_slice(&address[8..]);
    AffinityKey {
        netns_cookie: (u64::from_ne_bytes(high) ^ u64::from_ne_bytes(low)) | (1 << 63),
        frontend: *frontend,
        _pad: 0,
    }
}

/// Whether MASQUERADE would give a flow to `s.backend` another source
/// than its frontend's address (in `s.key.dst`): over IPv6, for a backend
/// on this node, the address the kernel selects toward the pod
/// (`ipv6_dev_get_saddr`, which MASQUERADE and `BPF_FIB_LOOKUP_SRC` both
/// ask, the route as forwarded from `uplink`): the pod network's gateway
/// address, the longest match with the pod's. It is then in
/// `s.nat_source`, and kept in `NAT_LOCAL_SOURCES` for the flow's later
/// packets. Over IPv4 MASQUERADE takes the first global address of the
/// node's devices (`inet_select_addr`, the host veth having none: the
/// node's address), not the route's preferred source the FIB would give
/// (the gateway's); and a backend on another node is reached by the
/// uplink, whose address it picks: the frontend's address stays.
#[inline(never)]
fn local_masquerade_source(ctx: &TcContext, s: &mut Scratch, uplink: u32) -> bool {
    // SAFETY: only whether an entry is there is read.
    if s.key.family == 4 || unsafe { ENDPOINTS_V6.get(s.backend.address) }.is_none() {
        return false;
    }
    // All-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    zero_words(&raw mut s.fib);
    s.fib.ifindex = uplink;
    s.fib.l4_protocol = s.key.protocol;
    s.fib.family = crate::remote::AF_INET6;
    s.fib.__bindgen_anon_3.ipv6_src = words(s.key.src);
    s.fib.__bindgen_anon_4.ipv6_dst = words(s.backend.address);
    // SAFETY: the skb pointer and a params struct of the size given.
    let found = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            &mut s.fib,
            size_of::<bpf_fib_lookup>() as i32,
            BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH,
        )
    };
    if found != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return false;
    }
    // SAFETY: the IPv6 member the lookup filled in; four words are 16 bytes.
    s.nat_source =
        unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(s.fib.__bindgen_anon_3.ipv6_src) };
    if s.nat_source == s.key.dst || s.nat_source == [0; 16] {
        return false;
    }
    if let Some(kept) = NAT_LOCAL_SOURCES.get_ptr_mut(1) {
        // SAFETY: a valid map value for the program's run; racing writers
        // write the same answer.
        unsafe { core::ptr::write_volatile(kept, s.nat_source) };
    }
    true
}

/// `s.nat_source` for the flow in `s.forward` (client's tuple in `s.key`):
/// the frontend's address, or the local one its first packet was given.
#[inline(always)]
fn load_nat_source(s: &mut Scratch) {
    s.nat_source = s.key.dst;
    if s.forward.flags & NAT_F_LOCAL_SOURCE != 0
        && let Some(kept) = NAT_LOCAL_SOURCES.get(u32::from(s.key.family != 4))
    {
        s.nat_source = *kept;
    }
}

/// Writes `s.reverse` under `s.reply` with a node port nobody has for the
/// same backend and node address, or one a spent flow holds (closed, or
/// idle: `take_spent`), which is forgotten both ways; the port, or None
/// when the tries ran out.
#[inline(always)]
fn free_port(s: &mut Scratch) -> Option<[u8; 2]> {
    let span = u32::from(NAT_PORT_MAX - NAT_PORT_MIN) + 1;
    for _ in 0..NAT_PORT_TRIES {
        // SAFETY: plain helper call.
        let offset = unsafe { bpf_get_prandom_u32() } % span;
        let port = (u32::from(NAT_PORT_MIN) + offset) as u16;
        s.reply.dst_port = port.to_be_bytes();
        // Looked up first: a write that finds the port taken has already
        // taken a node off the LRU's free list and must give it back, two
        // trips through its locks for nothing.
        let taken = match NAT_REVERSE.get_ptr(&s.reply) {
            None => NAT_REVERSE
                .insert(&s.reply, &s.reverse, u64::from(BPF_NOEXIST))
                .is_ok(),
            Some(held) => spent_at_a_glance(s, held) && take_claimed(s),
        };
        if taken {
            return Some(s.reply.dst_port);
        }
    }
    None
}

/// Whether the flow holding `s.reply`'s node port (its reverse entry,
/// `held`, read into `s.spent`) looks spent by its own marks: a reset TCP
/// flow at once, one closed by a FIN once idle a while (it may still be
/// finishing its handshake), a UDP flow once its replies are idle.
#[inline(always)]
fn spent_at_a_glance(s: &mut Scratch, held: *const NatReverse) -> bool {
    // SAFETY: a valid map value for the program's run; read once.
    s.spent = unsafe { core::ptr::read_volatile(held) };
    // Saturating: another CPU may have stamped the flow just after this
    // one read the clock; wrapped, a live flow would look idle for ages.
    let idle = s.reverse.last_ns.saturating_sub(s.spent.last_ns);
    if s.reply.protocol == IPPROTO_TCP {
        s.spent.flags & NAT_F_RESET != 0
            || (s.spent.flags & NAT_F_CLOSING != 0 && idle > TCP_CLOSED_REUSE_NS)
    } else {
        idle > UDP_REUSE_NS
    }
}

/// Takes `s.reply`'s node port, which looked spent, under a claim
/// (`NAT_CLAIMS`, written only where none is): another CPU's new flow may
/// have found the same port at the same time, and two writes would give
/// both flows one port. The port's entry is read again under the claim
/// (the other flow may have it by now), and the claim given back.
#[inline(always)]
fn take_claimed(s: &mut Scratch) -> bool {
    if NAT_CLAIMS
        .insert(&s.reply, &0, u64::from(BPF_NOEXIST))
        .is_err()
    {
        return false;
    }
    let taken = match NAT_REVERSE.get_ptr(&s.reply) {
        None => NAT_REVERSE
            .insert(&s.reply, &s.reverse, u64::from(BPF_NOEXIST))
            .is_ok(),
        Some(held) => take_spent(s, held) && NAT_REVERSE.insert(&s.reply, &s.reverse, 0).is_ok(),
    };
    let _ = NAT_CLAIMS.remove(&s.reply);
    taken
}

/// Whether the flow holding `s.reply`'s node port (its reverse entry,
/// `held`) is spent; if so its forward entry is forgotten (its reverse one
/// is then overwritten).
#[inline(always)]
fn take_spent(s: &mut Scratch, held: *const NatReverse) -> bool {
    let tcp = s.reply.protocol == IPPROTO_TCP;
    if !spent_at_a_glance(s, held) {
        return false;
    }
    s.spent_key = NatKey {
        src: s.spent.client,
        dst: s.spent.frontend,
        src_port: s.spent.client_port,
        dst_port: s.spent.frontend_port,
        protocol: s.reply.protocol,
        family: s.reply.family,
        _pad: [0; 2],
    };
    // The client's tuple may have a flow of its own by now, on another
    // port (its old forward entry forgotten first, by the LRU): that one
    // is kept. A UDP flow's client may still be sending, though nothing
    // came back: as conntrack, its flow is idle only when neither way is
    // used.
    let Some(forward) = NAT_FORWARD.get_ptr(&s.spent_key) else {
        return true;
    };
    // SAFETY: a valid map value for the program's run; each field read once.
    let (port, backend, last_ns) = unsafe {
        (
            core::ptr::read_volatile(&(*forward).nat_port),
            core::ptr::read_volatile(&(*forward).backend),
            core::ptr::read_volatile(&(*forward).last_ns),
        )
    };
    if port != s.reply.dst_port || backend != s.reply.src {
        return true;
    }
    if !tcp && s.reverse.last_ns.saturating_sub(last_ns) <= UDP_REUSE_NS {
        return false;
    }
    let _ = NAT_FORWARD.remove(&s.spent_key);
    true
}

/// A flow's packet translated to its backend (`s.forward`) and sent there.
#[inline(never)]
fn to_backend(ctx: &TcContext, s: &mut Scratch, uplink: u32) -> i32 {
    if rewrite(ctx, s, Toward::Backend).is_none() {
        return TC_ACT_SHOT as i32;
    }
    deliver_to_backend(ctx, s, uplink)
}

/// An ICMP error about a reply of the flow `flow` (the client's tuple),
/// made the backend's and sent to it.
#[inline(never)]
fn icmp_error_in(ctx: &TcContext, s: &mut Scratch, flow: *const NatForward, uplink: u32) -> i32 {
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

/// `nodeport_reply` (tail-called by `from_pod`): a local backend's packet
/// that is a reply of a translated flow goes back to the client. None: not
/// one.
#[inline(always)]
pub(crate) fn reply_from_pod(ctx: &TcContext) -> Option<i32> {
    let s = scratch()?;
    parse(ctx, s)?;
    if s.icmp != 0 {
        let flow = NAT_REVERSE.get_ptr(&s.key)?;
        return Some(icmp_error_out(ctx, s, flow));
    }
    let reply = NAT_REVERSE.get_ptr_mut(&s.key)?;
    keep_fragment_ports(s);
    Some(reply_out(ctx, s, reply))
}

/// A reply translated back (from the frontend, to the client) and sent out
/// of the uplink its flow came in by.
#[inline(never)]
fn reply_out(ctx: &TcContext, s: &mut Scratch, known: *mut NatReverse) -> i32 {
    // SAFETY: a valid map value for the program's run; read once.
    s.reverse = unsafe { core::ptr::read_volatile(known) };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let closes = s.closing & !s.reverse.flags != 0;
    if now.wrapping_sub(s.reverse.last_ns) > REFRESH_NS || closes {
        s.reverse.flags |= s.closing;
        // SAFETY: as above; racing writers only write a time or a flag.
        unsafe {
            core::ptr::write_volatile(&mut (*known).last_ns, now);
            core::ptr::write_volatile(&mut (*known).flags, s.reverse.flags);
        }
    }
    if rewrite(ctx, s, Toward::Client).is_none() {
        return TC_ACT_SHOT as i32;
    }
    back_to_client(ctx, s)
}

/// An ICMP error about a translated flow's packet to its backend goes to
/// the flow's client as conntrack's NAT would send it
/// (`icmp::toward_client`).
#[inline(never)]
fn icmp_error_out(ctx: &TcContext, s: &mut Scratch, flow: *const NatReverse) -> i32 {
    // SAFETY: a valid map value for the program's run; read once.
    s.reverse = unsafe { core::ptr::read_volatile(flow) };
    icmp::toward_client(s);
    if icmp::rewrite_error(ctx, s).is_none() {
        count(action::NODEPORT_DROPPED, ctx.len());
        return TC_ACT_SHOT as i32;
    }
    back_to_client(ctx, s)
}

/// What the path answers for a translated packet that must go into the
/// VXLAN tunnel: no tc verdict, the calling program sends it
/// (`tunnel::send` needs a frame of its own, which the path's deepest
/// calls leave no room for).
pub(crate) const TO_TUNNEL: i32 = i32::MIN;

/// A translated reply out of the uplink its flow came in by, or, to a pod
/// of a node reached through the VXLAN tunnel (the client of an
/// `externalTrafficPolicy: Local` flow), `TO_TUNNEL`: the FIB's way there
/// is the tunnel device, which sends nothing without a tunnel key.
#[inline(never)]
fn back_to_client(ctx: &TcContext, s: &Scratch) -> i32 {
    let len = ctx.len();
    // Only a client that kept its address can be a tunnelled node's pod:
    // the others' replies pay no tunnel lookup.
    if s.reverse.flags & NAT_F_CLIENT_KEPT != 0 && crate::tunnel::carries(ctx) {
        count(action::NODEPORT_REPLIED, len);
        return TO_TUNNEL;
    }
    match route_to_remote(ctx, s.reverse.ifindex, BPF_FIB_LOOKUP_OUTPUT as u32) {
        Some(verdict) => {
            // SAFETY: the context pointer is valid; `mark` is writable in tc.
            unsafe { (*ctx.skb.skb).mark = FAST_PATH_MARK };
            count(action::NODEPORT_REPLIED, len);
            verdict
        }
        None => {
            count(action::NODEPORT_DROPPED, len);
            TC_ACT_SHOT as i32
        }
    }
}

/// Where a rewrite sends a translated packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Toward {
    /// To the flow's backend (`s.forward`), from its node port when the
    /// flow has one (`s.nat_source`).
    Backend,
    /// A reply, to the client (`s.reverse`), from the frontend.
    Client,
}

/// Sets both ends of the packet at once, as `toward` says, in place
/// (direct packet access: `parse` read the same headers there, and no
/// helper has moved the packet since). The checksum differences are computed
/// here (RFC 1624) from the ends `parse` read (`s.key`): the addresses'
/// (into the IPv4 header's, written here, and the transport's through its
/// pseudo-header) and the ports'. Only the transport checksum goes
/// through a helper, once per difference: the kernel knows how the skb
/// carries it (a partial checksum of a locally sent packet holds only the
/// pseudo-header's sum, which the ports are not part of). None: the
/// headers are not there or a helper refused (the packet is then dropped).
#[inline(never)]
fn rewrite(ctx: &TcContext, s: &mut Scratch, toward: Toward) -> Option<()> {
    // Where the new ends are in the scratch area (pointers, not copies:
    // the program's calls share 512 bytes of stack); a kept source points
    // at the packet's own (`s.key`).
    let (source, destination, ports): (*const [u8; 16], *const [u8; 16], [[u8; 2]; 2]) =
        match toward {
            Toward::Backend if s.forward.nat_port != [0; 2] => (
                &raw const s.nat_source,
                &raw const s.forward.backend,
                [s.forward.nat_port, s.forward.backend_port],
            ),
            Toward::Backend => (
                &raw const s.key.src,
                &raw const s.forward.backend,
                [s.key.src_port, s.forward.backend_port],
            ),
            Toward::Client => (
                &raw const s.reverse.frontend,
                &raw const s.reverse.client,
                [s.reverse.frontend_port, s.reverse.client_port],
            ),
        };
    let ipv4 = s.key.family == 4;
    let words = if ipv4 { 1 } else { 4 };
    let mut ends_diff = 0;
    let mut ends_changed = false;
    for i in 0..words {
        // SAFETY: word `i` of 16-byte addresses in the scratch area, at
        // offsets `SCRATCH_ALIGNED` proves aligned.
        let (old_source, old_destination, new_source, new_destination) = unsafe {
            (
                aligned_word(&raw const s.key.src, i),
                aligned_word(&raw const s.key.dst, i),
                aligned_word(source, i),
                aligned_word(destination, i),
            )
        };
        ends_changed |= old_source != new_source || old_destination != new_destination;
        ends_diff = csum_add(
            csum_add(
                csum_add(csum_add(ends_diff, !old_source), new_source),
                !old_destination,
            ),
            new_destination,
        );
    }
    let ports_old = u32::from_ne_bytes([
        s.key.src_port[0],
        s.key.src_port[1],
        s.key.dst_port[0],
        s.key.dst_port[1],
    ]);
    let [source_port, destination_port] = ports;
    let ports_new = u32::from_ne_bytes([
        source_port[0],
        source_port[1],
        destination_port[0],
        destination_port[1],
    ]);
    // A later fragment has no transport header (the first one's checksum
    // covers the whole datagram).
    let later_fragment = s.fragment == FRAGMENT_LATER;
    let ports_changed = !later_fragment && ports_new != ports_old;
    // Bounded for the verifier: a transport header starts within the
    // first 255 bytes (`parse` took no other).
    let l4 = (s.l4 & 0xff) as usize;
    if !later_fragment {
        let (checksum_at, mangled_zero) = if s.key.protocol == IPPROTO_TCP {
            (l4 + 16, 0)
        } else {
            // A UDP checksum of 0 (none, over IPv4) stays 0.
            (l4 + 6, u64::from(BPF_F_MARK_MANGLED_0))
        };
        if ends_changed {
            ctx.l4_csum_replace(
                checksum_at,
                0,
                u64::from(ends_diff),
                u64::from(BPF_F_PSEUDO_HDR) | mangled_zero,
            )
            .ok()?;
        }
        if ports_changed {
            let ports_diff = csum_add(!ports_old, ports_new);
            ctx.l4_csum_replace(checksum_at, 0, u64::from(ports_diff), mangled_zero)
                .ok()?;
            let ports: *mut u32 = header_at(ctx.data(), ctx.data_end(), l4).ok()?;
            // SAFETY: bounds checked by `header_at`; the frame is writable.
            unsafe { core::ptr::write_unaligned(ports, ports_new) };
        }
    }
    if !ends_changed {
        return Some(());
    }
    if ipv4 {
        let header: *mut [u8; 12] = header_at(ctx.data(), ctx.data_end(), EthHdr::LEN + 8).ok()?;
        // SAFETY: bounds checked by `header_at` (TTL to the destination);
        // the frame is writable; scratch words as above.
        unsafe {
            let header = header.cast::<u8>();
            let checksum = header.add(2).cast::<[u8; 2]>();
            let old = u16::from_ne_bytes(*checksum);
            *checksum = csum_fold(csum_add(ends_diff, !u32::from(old))).to_ne_bytes();
            core::ptr::write_unaligned(header.add(4).cast::<u32>(), aligned_word(source, 0));
            core::ptr::write_unaligned(header.add(8).cast::<u32>(), aligned_word(destination, 0));
        }
    } else {
        // The addresses, source then destination, from byte 8 of the header.
        let ends: *mut [u32; 8] = header_at(ctx.data(), ctx.data_end(), EthHdr::LEN + 8).ok()?;
        for i in 0..4 {
            // SAFETY: as above.
            unsafe {
                core::ptr::write_unaligned(ends.cast::<u32>().add(i), aligned_word(source, i));
                core::ptr::write_unaligned(
                    ends.cast::<u32>().add(4 + i),
                    aligned_word(destination, i),
                );
            }
        }
    }
    Some(())
}

/// Word `i` of the 16-byte address at `address`.
///
/// # Safety
/// `address` points into the scratch area at a 4-aligned offset
/// (`SCRATCH_ALIGNED`), and `i` < 4.
#[inline(always)]
unsafe fn aligned_word(address: *const [u8; 16], i: usize) -> u32 {
    // SAFETY: the caller's promise; the map value is 8-aligned.
    unsafe { *address.cast::<u32>().add(i) }
}

// SCRATCH_ALIGNED: the scratch addresses `rewrite` reads a word at a time
// lie at 4-aligned offsets of a 4-aligned struct.
const _: () = {
    use core::mem::offset_of;
    assert!(align_of::<Scratch>() >= 4);
    assert!(offset_of!(Scratch, key) % 4 == 0);
    assert!(offset_of!(NatKey, src) % 4 == 0 && offset_of!(NatKey, dst) % 4 == 0);
    assert!(offset_of!(Scratch, nat_source) % 4 == 0);
    assert!((offset_of!(Scratch, forward) + offset_of!(NatForward, backend)) % 4 == 0);
    assert!(offset_of!(Scratch, reverse) % 4 == 0);
    assert!(offset_of!(NatReverse, client) % 4 == 0 && offset_of!(NatReverse, frontend) % 4 == 0);
};

/// One's-complement addition, as the kernel's `csum_add`.
#[inline(always)]
fn csum_add(sum: u32, value: u32) -> u32 {
    let (added, carry) = sum.overflowing_add(value);
    added.wrapping_add(u32::from(carry))
}

/// A 32-bit one's-complement sum folded to 16 bits and inverted: a
/// checksum field's value, as the kernel's `csum_fold`.
#[inline(always)]
fn csum_fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

//! Which packets may skip the host stack: none of a flow the host's
//! netfilter tracks.
//!
//! The fast path hands a packet to a pod without passing the host's
//! netfilter. For flows the host never saw, that changes nothing. A flow the
//! host saw (its first packet went through the stack: to a Service's
//! ClusterIP, a NodePort, a hostPort, a node address) has a conntrack entry,
//! and every packet of it must meet that entry: replies of a translated flow
//! (kube-proxy's DNAT to a Service backend, portmap's hostPort, ipMasq, an
//! operator's rule) must have the translation undone, or the peer gets a
//! reply from an address it never talked to; replies of any tracked flow
//! must keep its TCP state right, or the next packet the stack does see is
//! INVALID (kube-proxy drops those). The kernel's conntrack table is the
//! only complete record of what the host tracks and translates, whoever
//! did it, and it survives any restart of flatnet: each candidate packet is
//! looked up there, and one found goes to the stack.
//!
//! Whether a tracked flow is translated only decides how it is counted:
//! translated when the entry's other direction is not the packet's tuple
//! reversed (looking the reversed tuple up finds nothing).
//!
//! A conntrack lookup costs more than the rest of the program, so the
//! answer is kept per flow direction in `FLOWS` (an LRU hash) and a packet
//! reads it there (asking conntrack when it is not there, and writing the
//! answer). What keeps a kept answer true:
//! - "tracked" and "translated" stay true for the flow's life (the host
//!   never forgets a flow it tracks while packets come), and an answer
//!   kept after the flow's end only sends a later flow of the same tuple
//!   through the stack, which carries it as the bridge would.
//! - "clear" turns false when the host starts to track the flow, which
//!   takes a packet of it through the host stack. Every such packet that
//!   could matter leaves the stack through a flatnet program: into a local
//!   pod through its host veth's egress (`to_pod`), or to another node
//!   through the uplink's egress (`to_uplink`); for UDP both remove a
//!   "clear" of the packet's flow, both directions, before the packet goes on
//!   (`forget_clear`), so the next packet of either direction asks
//!   conntrack again. The fast path's own packets never meet the stack
//!   (a redirect skips it); those going to another node carry
//!   `FAST_PATH_MARK` past `to_uplink`.
//! - TCP asks again at every SYN instead: a new connection on a reused
//!   4-tuple is judged anew wherever it came from, so TCP answers need no
//!   taking back.
//! - "NodePort reply" is no conntrack answer: flatnet's own NodePort path
//!   writes it for the replies' tuple of a flow it translates keeping the
//!   client's address (`externalTrafficPolicy: Local`, hostPorts), whose
//!   replies may be for a pod of another node and would otherwise be routed
//!   untranslated. It overwrites any answer kept for that tuple and holds
//!   at a SYN (the reply's SYN-ACK) while the flow is in `NAT_REVERSE`;
//!   after that a SYN is judged anew. A UDP answer outliving its flow only
//!   sends that tuple's datagrams through `nodeport_reply` to the stack.
//!   So the reply path is asked once per flow, not for every packet.
//!
//! A forgotten answer (the LRU full, the map new after an upgrade) only
//! costs a lookup: the next packet asks conntrack.
//!
//! The kfuncs answer for TCP and UDP. ICMP errors are judged by the packet
//! they quote. ICMP echo is never translated by kube-proxy (any mode) and
//! keeps the fast path. Every other protocol (SCTP, fragments, IPv4 options,
//! IPv6 extension headers) goes through the stack, which tracks it as the
//! bridge would.

use flatnet_common::{FlowKey, verdict};
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::flow::conntrack::{Tuple, TupleV4, TupleV6, judge};
use crate::flow::kept::{judge_cached, judge_udp, key_v4, key_v6};
use crate::packet::header_at;
use crate::proto::{
    IPPROTO_HOPOPTS, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, Ports, TCP_ACK,
    TCP_SYN,
};

mod conntrack;
mod kept;

pub use conntrack::Conntrack;
pub use kept::{forget_clear, keep_nodeport_reply};

/// More-fragments flag and fragment offset of the IPv4 `frags` field.
const IPV4_FRAGMENT_MASK: u16 = 0x3fff;
/// The length of an IPv4 header without options, as `Ipv4Hdr::ihl` gives it.
const IPV4_PLAIN_LEN: u8 = Ipv4Hdr::LEN as u8;
/// Type, code, checksum and 4 more bytes: where an ICMP error quotes.
const ICMP_HEADER_LEN: usize = 8;

/// What the host stack has to say about a packet the fast path could take.
#[derive(PartialEq, Eq)]
pub enum Flow {
    /// Nothing: the host never saw the flow, the fast path is invisible.
    Clear,
    /// Of a flow the host translated: the stack must undo it.
    Translated,
    /// Of a flow the host tracks untranslated: the stack keeps its state.
    Tracked,
    /// Of a kind the conntrack lookup cannot judge: the stack takes it.
    Opaque,
    /// A local backend's reply of a flow flatnet's NodePort path translated
    /// keeping the client's address: `nodeport_reply` translates it back
    /// (the path marked the flow so when it started; `kept`).
    NodePortReply,
}

/// The first 14 bytes of TCP: ports, then flags in the last byte.
#[repr(C)]
struct TcpStart {
    ports: Ports,
    seq: [u8; 4],
    ack: [u8; 4],
    offset: u8,
    flags: u8,
}

/// Whether the TCP segment at `l4` continues a connection: anything but
/// one that opens it (a SYN without ACK). A pod's continuing segment to
/// another node's address answers a connection that node opened (or one
/// the stack carries, which `ipv4` and `ipv6` then find tracked); an
/// opening one is the pod's own, for the stack to see (and masquerade).
#[inline(always)]
pub(crate) fn tcp_continues(start: usize, end: usize, l4: usize) -> bool {
    let Ok(tcp) = header_at::<TcpStart>(start, end, l4) else {
        return false;
    };
    // SAFETY: bounds checked by `header_at`.
    (unsafe { (*tcp).flags }) & (TCP_SYN | TCP_ACK) != TCP_SYN
}

impl Flow {
    #[inline(always)]
    fn verdict(&self) -> u32 {
        match self {
            Flow::Translated => verdict::TRANSLATED,
            Flow::Tracked => verdict::TRACKED,
            Flow::NodePortReply => verdict::NODEPORT_REPLY,
            Flow::Clear | Flow::Opaque => verdict::CLEAR,
        }
    }

    #[inline(always)]
    fn from_verdict(value: u32) -> Flow {
        match value {
            verdict::TRANSLATED => Flow::Translated,
            verdict::TRACKED => Flow::Tracked,
            verdict::NODEPORT_REPLY => Flow::NodePortReply,
            _ => Flow::Clear,
        }
    }
}

/// An IPv4 address in the first 4 of 16 bytes, the rest zero: built as
/// one wide integer (two word stores), not byte by byte with a `memset`.
#[inline(always)]
fn in_16_bytes(address: [u8; 4]) -> [u8; 16] {
    u128::from(u32::from_le_bytes(address)).to_le_bytes()
}

/// The 4-byte start of an ICMP or ICMPv6 header.
#[repr(C)]
struct IcmpHeader {
    icmp_type: u8,
    code: u8,
    checksum: [u8; 2],
}

/// ICMPv4 messages that quote the packet they are about.
#[inline(always)]
pub(crate) fn is_icmp_error(icmp_type: u8) -> bool {
    // Destination unreachable, source quench, redirect, time exceeded,
    // parameter problem.
    matches!(icmp_type, 3 | 4 | 5 | 11 | 12)
}

/// ICMPv6 errors (types below 128).
#[inline(always)]
fn is_icmpv6_error(icmp_type: u8) -> bool {
    icmp_type < 128
}

/// A TCP or UDP packet whose transport header starts at `l4` of the
/// packet `(start, end, l4)`: the answer kept for its direction (`key` of
/// its ports; TCP asks again at a SYN), else conntrack's about the `tuple`
/// its ports make.
#[inline(always)]
fn transport<T: Tuple>(
    ct: &impl Conntrack,
    (start, end, l4): (usize, usize, usize),
    proto: u8,
    key: impl Fn(&Ports) -> FlowKey,
    tuple: impl Fn(&Ports) -> T,
) -> Flow {
    if crate::variant::without(flatnet_common::cost_variant::NO_FLOW) {
        return Flow::Clear;
    }
    if proto == IPPROTO_TCP {
        let Ok(tcp) = header_at::<TcpStart>(start, end, l4) else {
            return Flow::Opaque;
        };
        // SAFETY: bounds checked by `header_at`.
        let tcp = unsafe { &*tcp };
        let ask_again = tcp.flags & TCP_SYN != 0;
        let syn_ack = ask_again && tcp.flags & TCP_ACK != 0;
        return judge_cached(&key(&tcp.ports), ask_again, syn_ack, || {
            judge(ct, proto, tuple(&tcp.ports))
        });
    }
    let Ok(ports) = header_at::<Ports>(start, end, l4) else {
        return Flow::Opaque;
    };
    // SAFETY: bounds checked by `header_at`.
    let ports = unsafe { &*ports };
    judge_udp(&key(ports), || judge(ct, proto, tuple(ports)))
}

/// The IPv4 packet at `EthHdr::LEN`, whose header the caller already read.
#[inline(always)]
pub fn ipv4(ct: &impl Conntrack, start: usize, end: usize, ip: &Ipv4Hdr) -> Flow {
    if ip.ihl() != IPV4_PLAIN_LEN || u16::from_be_bytes(ip.frags) & IPV4_FRAGMENT_MASK != 0 {
        return Flow::Opaque;
    }
    let l4 = EthHdr::LEN + Ipv4Hdr::LEN;
    match ip.proto {
        IPPROTO_TCP | IPPROTO_UDP => transport(
            ct,
            (start, end, l4),
            ip.proto,
            |ports| key_v4(ip.src_addr, ip.dst_addr, ports, ip.proto),
            |ports| TupleV4::of(ip.src_addr, ip.dst_addr, ports),
        ),
        IPPROTO_ICMP => {
            let Ok(icmp) = header_at::<IcmpHeader>(start, end, l4) else {
                return Flow::Opaque;
            };
            // SAFETY: bounds checked by `header_at`.
            if !is_icmp_error(unsafe { (*icmp).icmp_type }) {
                return Flow::Clear;
            }
            quoted_v4(ct, start, end, l4 + ICMP_HEADER_LEN)
        }
        _ => Flow::Opaque,
    }
}

/// An ICMP error about the IPv4 packet quoted at `offset`: translated when
/// a reply to the quoted packet would be.
#[inline(always)]
fn quoted_v4(ct: &impl Conntrack, start: usize, end: usize, offset: usize) -> Flow {
    let Ok(inner) = header_at::<Ipv4Hdr>(start, end, offset) else {
        return Flow::Opaque;
    };
    // SAFETY: bounds checked by `header_at`.
    let inner = unsafe { &*inner };
    if inner.ihl() != IPV4_PLAIN_LEN {
        return Flow::Opaque;
    }
    match inner.proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            let Ok(ports) = header_at::<Ports>(start, end, offset + Ipv4Hdr::LEN) else {
                return Flow::Opaque;
            };
            // SAFETY: bounds checked by `header_at`.
            let ports = unsafe { &*ports };
            judge(
                ct,
                inner.proto,
                TupleV4::of(inner.src_addr, inner.dst_addr, ports).reversed(),
            )
        }
        IPPROTO_ICMP => Flow::Clear,
        _ => Flow::Opaque,
    }
}

/// A Hop-by-Hop options header holding only a jumbo payload option (RFC
/// 2675): how the kernel marks an IPv6 BIG TCP packet (payload length 0,
/// its real length in the option), the one extension header flatnet looks
/// past.
#[repr(C)]
struct JumboHopByHop {
    next_hdr: u8,
    /// In 8-byte units beyond the first 8: 0.
    hdr_ext_len: u8,
    option_type: u8,
    option_len: u8,
    jumbo_len: [u8; 4],
}
const IPV6_TLV_JUMBO: u8 = 0xc2;

/// The transport protocol of an IPv6 packet and where its header starts:
/// right after the IPv6 header, or after a jumbo Hop-by-Hop header. None
/// for any other extension header (the stack's to judge).
#[inline(always)]
pub(crate) fn ipv6_transport(start: usize, end: usize, ip: &Ipv6Hdr) -> Option<(u8, usize)> {
    let after = EthHdr::LEN + Ipv6Hdr::LEN;
    if ip.next_hdr != IPPROTO_HOPOPTS {
        return Some((ip.next_hdr, after));
    }
    let hop = header_at::<JumboHopByHop>(start, end, after).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let hop = unsafe { &*hop };
    let jumbo = hop.hdr_ext_len == 0 && hop.option_type == IPV6_TLV_JUMBO && hop.option_len == 4;
    jumbo.then_some((hop.next_hdr, after + size_of::<JumboHopByHop>()))
}

/// The IPv6 packet at `EthHdr::LEN`.
#[inline(always)]
pub fn ipv6(ct: &impl Conntrack, start: usize, end: usize, ip: &Ipv6Hdr) -> Flow {
    let Some((next_hdr, l4)) = ipv6_transport(start, end, ip) else {
        return Flow::Opaque;
    };
    match next_hdr {
        IPPROTO_TCP | IPPROTO_UDP => transport(
            ct,
            (start, end, l4),
            next_hdr,
            |ports| key_v6(ip.src_addr, ip.dst_addr, ports, next_hdr),
            |ports| TupleV6::of(ip.src_addr, ip.dst_addr, ports),
        ),
        IPPROTO_ICMPV6 => {
            let Ok(icmp) = header_at::<IcmpHeader>(start, end, l4) else {
                return Flow::Opaque;
            };
            // SAFETY: bounds checked by `header_at`.
            if !is_icmpv6_error(unsafe { (*icmp).icmp_type }) {
                return Flow::Clear;
            }
            quoted_v6(ct, start, end, l4 + ICMP_HEADER_LEN)
        }
        _ => Flow::Opaque,
    }
}

#[inline(always)]
fn quoted_v6(ct: &impl Conntrack, start: usize, end: usize, offset: usize) -> Flow {
    let Ok(inner) = header_at::<Ipv6Hdr>(start, end, offset) else {
        return Flow::Opaque;
    };
    // SAFETY: bounds checked by `header_at`.
    let inner = unsafe { &*inner };
    match inner.next_hdr {
        IPPROTO_TCP | IPPROTO_UDP => {
            let Ok(ports) = header_at::<Ports>(start, end, offset + Ipv6Hdr::LEN) else {
                return Flow::Opaque;
            };
            // SAFETY: bounds checked by `header_at`.
            let ports = unsafe { &*ports };
            judge(
                ct,
                inner.next_hdr,
                TupleV6::of(inner.src_addr, inner.dst_addr, ports).reversed(),
            )
        }
        IPPROTO_ICMPV6 => Flow::Clear,
        _ => Flow::Opaque,
    }
}

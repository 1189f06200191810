//! The answers kept in `FLOWS`: read, written, and taken back when the
//! host stack carries a packet of the flow.

use flatnet_common::{FlowKey, FlowVerdict, NatKey, verdict};
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::flow::{Flow, IPV4_PLAIN_LEN, in_16_bytes, ipv6_transport};
use crate::maps::flow::{FLOWS, UDP_FLOWS};
use crate::packet::header_at;
use crate::proto::{ETH_P_IP, ETH_P_IPV6, IPPROTO_UDP, Ports};

/// A packet's verdict: from `FLOWS` unless `ask_again` (a TCP SYN) or the
/// flow is not there, else from conntrack (`judge`), remembered. A NodePort
/// reply holds at a SYN-ACK (`syn_ack`) while its flow is there; a SYN
/// without ACK opens a connection, never a reply, and reads nothing kept.
#[inline(always)]
pub(super) fn judge_cached(
    key: &FlowKey,
    ask_again: bool,
    syn_ack: bool,
    judge: impl FnOnce() -> Flow,
) -> Flow {
    if (!ask_again || syn_ack)
        && let Some(known) = FLOWS.get_ptr(key)
    {
        // SAFETY: a valid map value for the program's run; read once.
        let kept = unsafe { core::ptr::read_volatile(&(*known).verdict) };
        if !ask_again
            || (kept == verdict::NODEPORT_REPLY
                && crate::nat_table::replies_of_a_translated_flow(key))
        {
            return Flow::from_verdict(kept);
        }
    }
    let flow = judge();
    let value = FlowVerdict {
        verdict: flow.verdict(),
        _pad: 0,
    };
    // A full map evicts its least recently used entry; a failed write only
    // means the next packet asks conntrack again.
    let _ = FLOWS.insert(key, &value, 0);
    flow
}

#[inline(always)]
pub(super) fn udp_flows_kept() -> bool {
    // SAFETY: a read of a constant the loader set (frozen .rodata).
    (unsafe { core::ptr::read_volatile(&UDP_FLOWS) }) != 0
}

/// A UDP packet's verdict: the kept answer where UDP answers are kept
/// (`UDP_FLOWS`), else conntrack's, asked every time and written nowhere
/// (but a NodePort reply, which the NodePort path writes either way).
#[inline(always)]
pub(super) fn judge_udp(key: &FlowKey, judge: impl FnOnce() -> Flow) -> Flow {
    if udp_flows_kept() {
        return judge_cached(key, false, false, judge);
    }
    if let Some(known) = FLOWS.get_ptr(key)
        // SAFETY: a valid map value for the program's run; read once.
        && unsafe { core::ptr::read_volatile(&(*known).verdict) } == verdict::NODEPORT_REPLY
    {
        return Flow::NodePortReply;
    }
    judge()
}

/// Marks `reply`, the replies' tuple of a flow the NodePort path has just
/// translated keeping its client's address, as such a flow's (see the
/// module's notes): its packets go to `nodeport_reply`. A failed write
/// (the map full) only leaves them to the route, untranslated, as before
/// the mark existed.
#[inline(always)]
pub fn keep_nodeport_reply(reply: &NatKey) {
    let key = FlowKey {
        src: reply.src,
        dst: reply.dst,
        sport: reply.src_port,
        dport: reply.dst_port,
        family: reply.family,
        proto: reply.protocol,
        _pad: [0; 2],
    };
    let value = FlowVerdict {
        verdict: verdict::NODEPORT_REPLY,
        _pad: 0,
    };
    let _ = FLOWS.insert(&key, &value, 0);
}

/// Removes a "clear" kept for `key`: the host stack carries a packet of
/// its flow now, so the host may track it from here on.
#[inline(always)]
pub(super) fn forget_if_clear(key: &FlowKey) {
    if let Some(known) = FLOWS.get_ptr(key) {
        // SAFETY: a valid map value for the program's run; read once.
        if unsafe { core::ptr::read_volatile(&(*known).verdict) } == verdict::CLEAR {
            let _ = FLOWS.remove(key);
        }
    }
}

/// The flow key of a packet with these addresses and ports.
#[inline(always)]
pub(super) fn key_v4(src: [u8; 4], dst: [u8; 4], ports: &Ports, proto: u8) -> FlowKey {
    FlowKey {
        src: in_16_bytes(src),
        dst: in_16_bytes(dst),
        sport: ports.src,
        dport: ports.dst,
        family: 4,
        proto,
        _pad: [0; 2],
    }
}

#[inline(always)]
pub(super) fn key_v6(src: [u8; 16], dst: [u8; 16], ports: &Ports, proto: u8) -> FlowKey {
    FlowKey {
        src,
        dst,
        sport: ports.src,
        dport: ports.dst,
        family: 6,
        proto,
        _pad: [0; 2],
    }
}

/// The same flow's other direction.
#[inline(always)]
pub(super) fn reversed(key: &FlowKey) -> FlowKey {
    FlowKey {
        src: key.dst,
        dst: key.src,
        sport: key.dport,
        dport: key.sport,
        family: key.family,
        proto: key.proto,
        _pad: [0; 2],
    }
}

/// The host stack hands the frame at `start` on (into a pod, or to another
/// node): a "clear" kept for its flow, either direction, goes. UDP over
/// IPv4 and IPv6 without options or extension headers; TCP needs no
/// taking back (a new connection's SYNs ask again, wherever they went),
/// and anything else has no kept answer.
#[inline(always)]
pub fn forget_clear(start: usize, end: usize) {
    // Only UDP answers need taking back (TCP asks again at every SYN), and
    // only where they are kept: the stack's other packets pay nothing.
    if !udp_flows_kept() {
        return;
    }
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return;
    };
    // SAFETY: bounds checked by `header_at`.
    let key = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
                return;
            };
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            if ip.proto != IPPROTO_UDP || ip.ihl() != IPV4_PLAIN_LEN {
                return;
            }
            let Ok(ports) = header_at::<Ports>(start, end, EthHdr::LEN + Ipv4Hdr::LEN) else {
                return;
            };
            // SAFETY: bounds checked by `header_at`.
            key_v4(ip.src_addr, ip.dst_addr, unsafe { &*ports }, ip.proto)
        }
        ETH_P_IPV6 => {
            let Ok(ip) = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN) else {
                return;
            };
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            let Some((next_hdr, l4)) = ipv6_transport(start, end, ip) else {
                return;
            };
            if next_hdr != IPPROTO_UDP {
                return;
            }
            let Ok(ports) = header_at::<Ports>(start, end, l4) else {
                return;
            };
            // SAFETY: bounds checked by `header_at`.
            key_v6(ip.src_addr, ip.dst_addr, unsafe { &*ports }, next_hdr)
        }
        _ => return,
    };
    forget_if_clear(&key);
    forget_if_clear(&reversed(&key));
}

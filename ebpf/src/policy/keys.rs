//! A packet as policy sees it: its flow key (5-tuple; for an ICMP error,
//! the flow of the packet it quotes), its protocol and ports.

use flatnet_common::PolicyFlowKey;
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::flow::{ipv6_transport, is_icmp_error};
use crate::packet::header_at;
use crate::policy::IPV4_OFFSET_MASK;
use crate::proto::{
    ETH_P_IP, ETH_P_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
    Ports, is_link_local, is_multicast,
};

/// The start of an ICMP or ICMPv6 header.
#[repr(C)]
pub(super) struct IcmpHeader {
    icmp_type: u8,
    code: u8,
}

/// What a packet is, as policy sees it: its flow key (slot and direction
/// filled in by the judge), and whether it is an ICMP error quoting a
/// packet of `quoted` (a key of that packet).
pub(super) struct Judged {
    pub(super) key: PolicyFlowKey,
    /// Neighbour discovery or MLD: never judged.
    pub(super) exempt: bool,
    /// An ICMP or ICMPv6 error: where the IP header it quotes starts (else
    /// 0). An error of a recorded flow passes as part of it; the flow's
    /// key is read from the quote only then (kept off the stack the rest of
    /// the time: the programs are at the verifier's stack limit).
    pub(super) quote: usize,
}

/// ICMP's header before the quoted packet of an error: type, code,
/// checksum and 4 bytes (unused, or the next-hop MTU).
pub(super) const ICMP_ERROR_HEADER: usize = 8;

/// The key of the flow an ICMP(v6) error whose quoted IP header is at
/// `offset` belongs to (slot and direction left to the judge): the quoted
/// packet's reverse. None when the quote is cut short; its ports are left
/// zero when they are not in the packet.
#[inline(always)]
pub(super) fn quoted_v4(start: usize, end: usize, offset: usize) -> Option<PolicyFlowKey> {
    let inner = header_at::<Ipv4Hdr>(start, end, offset).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let inner = unsafe { &*inner };
    let mut key = PolicyFlowKey {
        src: in_16_bytes(inner.dst_addr),
        dst: in_16_bytes(inner.src_addr),
        protocol: inner.proto,
        family: 4,
        ..PolicyFlowKey::default()
    };
    if inner.ihl() == Ipv4Hdr::LEN as u8 {
        ports_at(start, end, offset + Ipv4Hdr::LEN, inner.proto, &mut key);
        core::mem::swap(&mut key.sport, &mut key.dport);
    }
    Some(key)
}

#[inline(always)]
pub(super) fn quoted_v6(start: usize, end: usize, offset: usize) -> Option<PolicyFlowKey> {
    let inner = header_at::<Ipv6Hdr>(start, end, offset).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let inner = unsafe { &*inner };
    let mut key = PolicyFlowKey {
        src: inner.dst_addr,
        dst: inner.src_addr,
        protocol: inner.next_hdr,
        family: 6,
        ..PolicyFlowKey::default()
    };
    // Ports only right after the fixed header (no extension headers).
    ports_at(start, end, offset + Ipv6Hdr::LEN, inner.next_hdr, &mut key);
    core::mem::swap(&mut key.sport, &mut key.dport);
    Some(key)
}

/// Whether `protocol` has the ports policy judges.
#[inline(always)]
pub(super) fn has_ports(protocol: u8) -> bool {
    matches!(protocol, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP)
}

/// The ports of a `protocol` header at `offset`, when it has them and they
/// are in the packet (else zero).
#[inline(always)]
pub(super) fn ports_at(
    start: usize,
    end: usize,
    offset: usize,
    protocol: u8,
    key: &mut PolicyFlowKey,
) {
    if !has_ports(protocol) {
        return;
    }
    if let Ok(ports) = header_at::<Ports>(start, end, offset) {
        // SAFETY: bounds checked by `header_at`.
        unsafe {
            key.sport = (*ports).src;
            key.dport = (*ports).dst;
        }
    }
}

/// An IPv4 address in the first 4 of 16 bytes (as `PolicyFlowKey` holds it).
#[inline(always)]
pub(super) fn in_16_bytes(address: [u8; 4]) -> [u8; 16] {
    u128::from(u32::from_le_bytes(address)).to_le_bytes()
}

/// The IPv4 packet at `EthHdr::LEN`, for policy.
#[inline(always)]
pub(super) fn judged_v4(start: usize, end: usize, ip: &Ipv4Hdr) -> Judged {
    let mut judged = Judged {
        key: PolicyFlowKey {
            src: in_16_bytes(ip.src_addr),
            dst: in_16_bytes(ip.dst_addr),
            protocol: ip.proto,
            family: 4,
            ..PolicyFlowKey::default()
        },
        exempt: false,
        quote: 0,
    };
    // With options or past the first fragment, the ports are not read:
    // only an `any` entry allows such a packet.
    if ip.ihl() != Ipv4Hdr::LEN as u8 || u16::from_be_bytes(ip.frags) & IPV4_OFFSET_MASK != 0 {
        return judged;
    }
    let l4 = EthHdr::LEN + Ipv4Hdr::LEN;
    ports_at(start, end, l4, ip.proto, &mut judged.key);
    if ip.proto == IPPROTO_ICMP
        && let Ok(icmp) = header_at::<IcmpHeader>(start, end, l4)
        // SAFETY: bounds checked by `header_at`.
        && is_icmp_error(unsafe { (*icmp).icmp_type })
    {
        judged.quote = l4 + ICMP_ERROR_HEADER;
    }
    judged
}

/// The IPv6 packet at `EthHdr::LEN`, for policy.
#[inline(always)]
pub(super) fn judged_v6(start: usize, end: usize, ip: &Ipv6Hdr) -> Judged {
    let mut judged = Judged {
        key: PolicyFlowKey {
            src: ip.src_addr,
            dst: ip.dst_addr,
            protocol: ip.next_hdr,
            family: 6,
            ..PolicyFlowKey::default()
        },
        // Link-scope traffic (to fe80::/10, or to interface- and
        // link-local multicast, like MLD reports behind their Hop-by-Hop
        // router alert to ff02::16) never leaves the pod's link: the host's
        // to answer, not policy's to judge.
        exempt: is_link_local(&ip.dst_addr)
            || (is_multicast(&ip.dst_addr) && ip.dst_addr[1] & 0x0f <= 2),
        quote: 0,
    };
    let Some((protocol, l4)) = ipv6_transport(start, end, ip) else {
        return judged;
    };
    judged.key.protocol = protocol;
    ports_at(start, end, l4, protocol, &mut judged.key);
    if protocol == IPPROTO_ICMPV6
        && let Ok(icmp) = header_at::<IcmpHeader>(start, end, l4)
    {
        // SAFETY: bounds checked by `header_at`.
        let icmp_type = unsafe { (*icmp).icmp_type };
        // MLD (130-132, 143) and neighbour discovery (133-137).
        judged.exempt |= matches!(icmp_type, 130..=137 | 143);
        // Errors: destination unreachable, packet too big, time exceeded,
        // parameter problem.
        if icmp_type < 128 {
            judged.quote = l4 + ICMP_ERROR_HEADER;
        }
    }
    judged
}

/// The IP frame at `start` as policy sees it; None for frames that are not
/// IPv4 or IPv6, or whose IP header is cut short: not policy's to judge.
#[inline(always)]
pub(super) fn judged_frame(start: usize, end: usize) -> Option<Judged> {
    let eth = header_at::<EthHdr>(start, end, 0).ok()?;
    // SAFETY: `header_at` checked the header lies inside the packet.
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let ip = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            Some(judged_v4(start, end, unsafe { &*ip }))
        }
        ETH_P_IPV6 => {
            let ip = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            Some(judged_v6(start, end, unsafe { &*ip }))
        }
        _ => None,
    }
}

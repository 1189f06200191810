//! Neighbour answers: a pod's ARP requests and IPv6 neighbour solicitations
//! answered in place with its host veth's MAC, so pods never need a bridge
//! to find their neighbours or their gateway.

use flatnet_common::action;
use network_types::arp::ArpHdr;
use network_types::eth::EthHdr;
use network_types::ip::Ipv6Hdr;

use crate::counters::count;
use crate::decision::Decision;
use crate::maps::endpoints::HOST_VETHS;
use crate::packet::{header_at, snapshot};
use crate::proto::{ETH_P_IP, IPPROTO_ICMPV6};

pub(crate) const ARPHRD_ETHER: u16 = 1;

pub(crate) const ARPOP_REQUEST: u16 = 1;

pub(crate) const ARPOP_REPLY: u16 = 2;

pub(crate) const ND_NEIGHBOR_SOLICIT: u8 = 135;

pub(crate) const ND_NEIGHBOR_ADVERT: u8 = 136;

pub(crate) const ND_OPT_SOURCE_LL: u8 = 1;

pub(crate) const ND_OPT_TARGET_LL: u8 = 2;

/// Solicited and Override flags of a neighbour advertisement.
pub(crate) const NA_FLAGS_SOLICITED_OVERRIDE: u8 = 0x60;

/// A neighbour solicitation carrying the sender's link-layer address: the
/// only shape answered here (and exactly the size of the answer, so the
/// frame is rewritten in place).
#[repr(C)]
pub(crate) struct NeighbourMessage {
    pub(crate) icmp_type: u8,
    code: u8,
    checksum: [u8; 2],
    flags: [u8; 4],
    target: [u8; 16],
    option_type: u8,
    option_len: u8,
    link_addr: [u8; 6],
}

pub(crate) const ND_LEN: usize = size_of::<NeighbourMessage>();

/// Answers a pod's ARP request with the MAC of its host veth, so the pod
/// sends everything (other pods, gateway, outside) to this program.
#[inline(always)]
pub(crate) fn arp(
    start: usize,
    end: usize,
    eth: *mut EthHdr,
    ingress: u32,
) -> Result<Decision, ()> {
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
pub(crate) fn neighbour_solicitation(
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
pub(crate) fn icmpv6_checksum(ip: &Ipv6Hdr, msg: &NeighbourMessage) -> u16 {
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

//! Frames built byte by byte, checksums computed here (RFC 1071), not
//! with anything of the datapath's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub type Mac = [u8; 6];

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const ETH_LEN: usize = 14;
pub const IPV4_LEN: usize = 20;
pub const IPV6_LEN: usize = 40;
pub const BROADCAST: Mac = [0xff; 6];
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;
pub const ARPOP_REQUEST: u16 = 1;
pub const ARPOP_REPLY: u16 = 2;
pub const ND_NEIGHBOR_SOLICIT: u8 = 135;
pub const ND_NEIGHBOR_ADVERT: u8 = 136;
/// Hop limit every neighbour discovery message carries (RFC 4861).
pub const ND_HOP_LIMIT: u8 = 255;

/// The Internet checksum: ones' complement of the ones' complement sum
/// of the 16-bit words (an odd last byte padded with zero). Over data
/// that holds a correct checksum it gives 0.
pub fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The pseudo-header TCP, UDP and ICMPv6 checksums cover.
pub fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => [
            &src.octets()[..],
            &dst.octets(),
            &[0, proto],
            &(len as u16).to_be_bytes(),
        ]
        .concat(),
        (IpAddr::V6(src), IpAddr::V6(dst)) => [
            &src.octets()[..],
            &dst.octets(),
            &(len as u32).to_be_bytes(),
            &[0, 0, 0, proto],
        ]
        .concat(),
        _ => panic!("{src} and {dst} are of different families"),
    }
}

/// `message` with the checksum at `at` computed over the pseudo-header
/// of (`src`, `dst`, `proto`) and the message.
fn with_checksum(mut message: Vec<u8>, at: usize, src: IpAddr, dst: IpAddr, proto: u8) -> Vec<u8> {
    let covered = [
        pseudo_header(src, dst, proto, message.len()),
        message.clone(),
    ]
    .concat();
    message[at..at + 2].copy_from_slice(&checksum(&covered).to_be_bytes());
    message
}

pub fn ethernet(dst: Mac, src: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    [&dst[..], &src, &ethertype.to_be_bytes(), payload].concat()
}

/// An Ethernet/IPv4 ARP message.
pub fn arp(
    operation: u16,
    sender_mac: Mac,
    sender_ip: Ipv4Addr,
    target_mac: Mac,
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    [
        &1u16.to_be_bytes()[..],
        &ETH_P_IP.to_be_bytes(),
        &[6, 4],
        &operation.to_be_bytes(),
        &sender_mac,
        &sender_ip.octets(),
        &target_mac,
        &target_ip.octets(),
    ]
    .concat()
}

/// An IPv4 header without options (DF set) and `payload`.
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, ttl: u8, proto: u8, payload: &[u8]) -> Vec<u8> {
    ipv4_with_id(src, dst, ttl, proto, 0x1234, payload)
}

/// `ipv4` with the identification `id` (which moves the checksum).
pub fn ipv4_with_id(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ttl: u8,
    proto: u8,
    id: u16,
    payload: &[u8],
) -> Vec<u8> {
    let total = (IPV4_LEN + payload.len()) as u16;
    let mut header = [
        &[0x45, 0][..],
        &total.to_be_bytes(),
        &id.to_be_bytes(),
        &0x4000u16.to_be_bytes(),
        &[ttl, proto, 0, 0],
        &src.octets(),
        &dst.octets(),
    ]
    .concat();
    let sum = checksum(&header);
    header[10..12].copy_from_slice(&sum.to_be_bytes());
    [header, payload.to_vec()].concat()
}

/// An IPv6 header (no extension headers) and `payload`.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, next: u8, payload: &[u8]) -> Vec<u8> {
    [
        &[0x60, 0, 0, 0][..],
        &(payload.len() as u16).to_be_bytes(),
        &[next, hop_limit],
        &src.octets(),
        &dst.octets(),
        payload,
    ]
    .concat()
}

/// An IP packet of the addresses' family: (ethertype, packet).
pub fn ip(src: IpAddr, dst: IpAddr, ttl: u8, proto: u8, payload: &[u8]) -> (u16, Vec<u8>) {
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => (ETH_P_IP, ipv4(src, dst, ttl, proto, payload)),
        (IpAddr::V6(src), IpAddr::V6(dst)) => (ETH_P_IPV6, ipv6(src, dst, ttl, proto, payload)),
        _ => panic!("{src} and {dst} are of different families"),
    }
}

/// A TCP header without options, no payload.
pub fn tcp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let ack_number: u32 = if flags & TCP_ACK != 0 { 1 } else { 0 };
    let segment = [
        &sport.to_be_bytes()[..],
        &dport.to_be_bytes(),
        &0x1000_0000u32.to_be_bytes(),
        &ack_number.to_be_bytes(),
        &[0x50, flags],
        &64240u16.to_be_bytes(),
        &[0, 0, 0, 0],
    ]
    .concat();
    with_checksum(segment, 16, src, dst, IPPROTO_TCP)
}

pub fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let datagram = [
        &sport.to_be_bytes()[..],
        &dport.to_be_bytes(),
        &((8 + payload.len()) as u16).to_be_bytes(),
        &[0, 0],
        payload,
    ]
    .concat();
    with_checksum(datagram, 6, src, dst, IPPROTO_UDP)
}

/// An ICMP message (its checksum covers the message alone).
pub fn icmpv4(icmp_type: u8, code: u8, body: &[u8]) -> Vec<u8> {
    let mut message = [&[icmp_type, code, 0, 0][..], body].concat();
    let sum = checksum(&message);
    message[2..4].copy_from_slice(&sum.to_be_bytes());
    message
}

/// An ICMPv6 message (its checksum covers the pseudo-header too).
pub fn icmpv6(src: Ipv6Addr, dst: Ipv6Addr, icmp_type: u8, code: u8, body: &[u8]) -> Vec<u8> {
    let message = [&[icmp_type, code, 0, 0][..], body].concat();
    with_checksum(message, 2, src.into(), dst.into(), IPPROTO_ICMPV6)
}

/// An echo request of the addresses' family, 8 bytes of ICMP: (protocol, message).
pub fn echo_request(src: IpAddr, dst: IpAddr) -> (u8, Vec<u8>) {
    let id_and_sequence = [0x12, 0x34, 0, 1];
    match (src, dst) {
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            (IPPROTO_ICMPV6, icmpv6(src, dst, 128, 0, &id_and_sequence))
        }
        _ => (IPPROTO_ICMP, icmpv4(8, 0, &id_and_sequence)),
    }
}

/// The "port unreachable" a host at `src` sends to `dst` about
/// `quoted` (the IP packet it got): (protocol, message).
pub fn port_unreachable(src: IpAddr, dst: IpAddr, quoted: &[u8]) -> (u8, Vec<u8>) {
    let body = [&[0, 0, 0, 0][..], quoted].concat();
    match (src, dst) {
        (IpAddr::V6(src), IpAddr::V6(dst)) => (IPPROTO_ICMPV6, icmpv6(src, dst, 1, 4, &body)),
        _ => (IPPROTO_ICMP, icmpv4(3, 3, &body)),
    }
}

/// ff02::1:ffXX:XXXX, where a solicitation for `target` goes.
pub fn solicited_node(target: Ipv6Addr) -> Ipv6Addr {
    let t = target.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
    ])
}

/// 33:33 and the group's last 32 bits: an IPv6 multicast's MAC.
pub fn multicast_mac(group: Ipv6Addr) -> Mac {
    let g = group.octets();
    [0x33, 0x33, g[12], g[13], g[14], g[15]]
}

/// A neighbour solicitation (an IPv6 packet) for `target`, with the
/// source link-layer option when `source_mac` is given.
pub fn neighbour_solicitation(src: Ipv6Addr, target: Ipv6Addr, source_mac: Option<Mac>) -> Vec<u8> {
    let dst = solicited_node(target);
    let option: Vec<u8> = source_mac
        .map(|mac| [&[1, 1][..], &mac].concat())
        .unwrap_or_default();
    let body = [&[0, 0, 0, 0][..], &target.octets(), &option].concat();
    ipv6(
        src,
        dst,
        ND_HOP_LIMIT,
        IPPROTO_ICMPV6,
        &icmpv6(src, dst, ND_NEIGHBOR_SOLICIT, 0, &body),
    )
}

/// The advertisement a solicitation from `asker` for `target` must get:
/// Solicited and Override set, `target_mac` in the target link-layer option.
pub fn neighbour_advertisement(asker: Ipv6Addr, target: Ipv6Addr, target_mac: Mac) -> Vec<u8> {
    let body = [&[0x60, 0, 0, 0][..], &target.octets(), &[2, 1], &target_mac].concat();
    ipv6(
        target,
        asker,
        ND_HOP_LIMIT,
        IPPROTO_ICMPV6,
        &icmpv6(target, asker, ND_NEIGHBOR_ADVERT, 0, &body),
    )
}

/// `frame` with its Ethernet destination and source replaced.
pub fn with_macs(frame: &[u8], dst: Mac, src: Mac) -> Vec<u8> {
    [&dst[..], &src, &frame[12..]].concat()
}

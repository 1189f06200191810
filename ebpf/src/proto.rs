//! Protocol numbers, ports and address classes: the one definition of
//! each EtherType, IP protocol number, TCP flag and header fact the
//! datapath reads, and of the address tests it shares.

pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_ARP: u16 = 0x0806;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
/// Address families (linux/socket.h), as `bpf_fib_lookup` and a
/// `sockaddr`'s first field hold them.
pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;

/// `skb->pkt_type` of a frame addressed to this host (linux/if_packet.h).
pub(crate) const PACKET_HOST: u32 = 0;

/// IPv6's Hop-by-Hop options header.
pub(crate) const IPPROTO_HOPOPTS: u8 = 0;
pub(crate) const IPPROTO_ICMP: u8 = 1;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
/// IPv6's fragment header.
pub(crate) const IPPROTO_FRAGMENT: u8 = 44;
pub(crate) const IPPROTO_ICMPV6: u8 = 58;
pub(crate) const IPPROTO_SCTP: u8 = 132;

/// An IPv6 fragment header: next header, reserved, offset and flags (the
/// offset in 8-byte units in the high 13 bits, "more" in the lowest),
/// identification.
pub(crate) const FRAGMENT_HEADER_LEN: usize = 8;

/// Flags in the TCP flags byte.
pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;

/// Source and destination ports, the first 4 bytes of TCP, UDP and SCTP.
#[repr(C)]
pub(crate) struct Ports {
    pub(crate) src: [u8; 2],
    pub(crate) dst: [u8; 2],
}

/// Whether `address` is an IPv6 link-local unicast address (fe80::/10).
#[inline(always)]
pub(crate) fn is_link_local(address: &[u8; 16]) -> bool {
    address[0] == 0xfe && address[1] & 0xc0 == 0x80
}

/// Whether `address` is an IPv6 multicast address (ff00::/8).
#[inline(always)]
pub(crate) fn is_multicast(address: &[u8; 16]) -> bool {
    address[0] == 0xff
}

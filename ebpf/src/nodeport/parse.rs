//! Reading a packet's flow for the NodePort path: whether it may be the
//! path's at all (`candidate`), its flow into the scratch area (`parse`),
//! and fragments: an IPv6 fragment header, and a first fragment's ports
//! kept for the later ones.

use aya_ebpf::programs::TcContext;
use flatnet_common::{
    FragmentKey, FragmentKey6, FragmentPorts, NAT_F_CLOSING, NAT_F_RESET, NAT_PORT_MIN, NatKey,
    external_port,
};
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::external_ports::{any_listening, listening_on};
use crate::maps::nodeport::{
    FRAGMENT_FIRST, FRAGMENT_LATER, FRAGMENT_NONE, NAT_FRAGMENTS, NAT_FRAGMENTS6, NODEPORT_SCRATCH,
    Scratch,
};
use crate::nodeport::icmp;
use crate::packet::header_at;
use crate::proto::{
    ETH_P_IP, ETH_P_IPV6, FRAGMENT_HEADER_LEN, IPPROTO_FRAGMENT, IPPROTO_ICMP, IPPROTO_ICMPV6,
    IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
};

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
pub(crate) fn scratch() -> Option<&'static mut Scratch> {
    // SAFETY: per-CPU: no other program uses this CPU's entry while this
    // one runs.
    NODEPORT_SCRATCH.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

/// Reads the packet's flow into `s`, if it is one the path serves.
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext, s: &mut Scratch) -> Option<()> {
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
pub(crate) fn keep_fragment_ports(s: &Scratch) {
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

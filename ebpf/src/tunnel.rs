//! VXLAN without the host stack: a pod's packet for a tunnelled node's pod
//! goes into the node's VXLAN device with the tunnel key set to that node
//! (the device encapsulates it, as for the stack's encap route); a packet
//! the device decapsulated has its inner source checked against the outer
//! one before anything else sees it.

use aya_ebpf::bindings::bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS;
use aya_ebpf::bindings::{BPF_F_TUNINFO_IPV6, BPF_F_ZERO_CSUM_TX, bpf_tunnel_key};
use aya_ebpf::btf_maps::lpm_trie::Key;
use aya_ebpf::helpers::generated::{
    bpf_check_mtu, bpf_redirect, bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key,
};
use aya_ebpf::programs::TcContext;
use flatnet_common::{
    AF_INET_VALUE, AF_INET6_VALUE, REMOTE_F_TUNNEL, RemoteNode, TunnelConfig, vtep_mac,
};
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::maps::endpoints::{ENDPOINTS_V4, ENDPOINTS_V6};
use crate::maps::remote::{REMOTE_CIDRS_V4, REMOTE_CIDRS_V6, TUNNEL};
use crate::packet::header_at;
use crate::proto::{ETH_P_IP, ETH_P_IPV6};
use crate::remote::{MTU_CHECK_SEGMENTS, take_hop, words};

/// Whether a pod's packet is for a pod of a node the tunnel reaches.
#[inline(always)]
pub(crate) fn carries(ctx: &TcContext) -> bool {
    peer(ctx).is_some()
}

/// The tunnel's configuration and the node whose pod the packet is for,
/// when that node is reached through the tunnel (and the packet may take
/// one more hop).
#[inline(always)]
fn peer(ctx: &TcContext) -> Option<(TunnelConfig, RemoteNode)> {
    // SAFETY: a valid map value for the program's run, copied at once.
    let config = unsafe { core::ptr::read_volatile(TUNNEL.get(0)?) };
    if config.ifindex == 0 {
        return None;
    }
    let (start, end) = (ctx.data(), ctx.data_end());
    let eth: *mut EthHdr = header_at(start, end, 0).ok()?;
    // SAFETY: `header_at` checked the header lies inside the packet.
    let ether_type = u16::from_be(unsafe { (*eth).ether_type });
    let node = match ether_type {
        ETH_P_IP => {
            let ip: *const Ipv4Hdr = header_at(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            if ip.ttl <= 1 {
                return None;
            }
            REMOTE_CIDRS_V4.get(&Key::new(32, ip.dst_addr))
        }
        ETH_P_IPV6 => {
            let ip: *const Ipv6Hdr = header_at(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let ip = unsafe { &*ip };
            if ip.hop_limit <= 1 {
                return None;
            }
            REMOTE_CIDRS_V6.get(&Key::new(128, ip.dst_addr))
        }
        _ => return None,
    };
    // SAFETY: a valid map value for the program's run, copied at once.
    let node = unsafe { core::ptr::read_volatile(node?) };
    if node.flags & REMOTE_F_TUNNEL == 0 {
        return None;
    }
    Some((config, node))
}

/// Sends a pod's packet for a tunnelled node's pod into the VXLAN device,
/// its tunnel key aimed at that node, the inner frame written as the
/// stack's encap route would (TTL less one, the device's MAC to the peer
/// device's). None: the host stack must take it (no device, the CIDR no
/// longer tunnelled, TTL expiring, too big for the tunnel: the stack then
/// answers with ICMP).
#[inline(always)]
pub(crate) fn send(ctx: &TcContext) -> Option<i32> {
    let (config, node) = peer(ctx)?;
    let skb = ctx.skb.skb;
    // Against the device's MTU; a GSO packet by its segments (without
    // BPF_MTU_CHK_SEGS the helper lets every GSO packet through, and the
    // device would fragment the outer packet instead of the stack's ICMP
    // "too big" telling the pod).
    let mut mtu_len: u32 = 0;
    // SAFETY: the skb pointer and a u32 the helper writes the MTU to.
    if unsafe {
        bpf_check_mtu(
            skb as *mut _,
            config.ifindex,
            &mut mtu_len,
            0,
            MTU_CHECK_SEGMENTS,
        )
    } != i64::from(BPF_MTU_CHK_RET_SUCCESS)
    {
        return None;
    }
    // SAFETY: all-zero is a valid bpf_tunnel_key (integers and unions of them).
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    key.tunnel_id = config.vni;
    // The outer header as the stack's encap route makes it: TTL and TOS
    // left to the device (its route's hop limit, the inner ECN bits), no
    // UDP checksum over IPv4 (RFC 7348), one over IPv6 (RFC 6935).
    let flags = if node.family == AF_INET6_VALUE {
        key.__bindgen_anon_1.remote_ipv6 = words(node.node_address);
        u64::from(BPF_F_TUNINFO_IPV6)
    } else {
        let a = node.node_address;
        key.__bindgen_anon_1.remote_ipv4 = u32::from_be_bytes([a[0], a[1], a[2], a[3]]);
        u64::from(BPF_F_ZERO_CSUM_TX)
    };
    // SAFETY: the skb pointer and a key of the size given.
    let set =
        unsafe { bpf_skb_set_tunnel_key(skb, &mut key, size_of::<bpf_tunnel_key>() as u32, flags) };
    if set != 0 {
        return None;
    }
    // Only now, when the packet surely goes into the tunnel, is it changed.
    let (start, end) = (ctx.data(), ctx.data_end());
    let eth: *mut EthHdr = header_at(start, end, 0).ok()?;
    // SAFETY: `header_at` checked the header lies inside the packet.
    let ipv4 = u16::from_be(unsafe { (*eth).ether_type }) == ETH_P_IP;
    take_hop(start, end, ipv4)?;
    // SAFETY: bounds checked above; the frame is writable.
    unsafe {
        (*eth).dst_addr = vtep_mac(&node.node_address, node.family);
        (*eth).src_addr = config.mac;
    }
    // SAFETY: plain helper call: egress of the VXLAN device.
    Some(unsafe { bpf_redirect(config.ifindex, 0) } as i32)
}

/// Whose a decapsulated packet's inner source is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TunnelSource {
    /// A pod of the node the tunnel's outer source is: the fast path may
    /// take it.
    PeerPod,
    /// A pod CIDR address that is not the sending node's (another node's
    /// pod, a local pod): spoofed, dropped.
    Refused,
    /// Not a pod's (the sending node itself, a Service's SNAT): the stack's.
    Other,
}

/// Checks a decapsulated packet's inner source against the outer source
/// the tunnel saw it from: a node may only send from its own pod CIDR.
#[inline(always)]
pub(crate) fn source(ctx: &TcContext) -> TunnelSource {
    let Some((outer, family)) = outer_source(ctx) else {
        return TunnelSource::Other;
    };
    let (start, end) = (ctx.data(), ctx.data_end());
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return TunnelSource::Other;
    };
    // SAFETY: `header_at` checked the header lies inside the packet.
    let (node, local) = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
                return TunnelSource::Other;
            };
            // SAFETY: bounds checked by `header_at`.
            let src = unsafe { (*ip).src_addr };
            match REMOTE_CIDRS_V4.get(&Key::new(32, src)) {
                Some(node) => (Some(node), false),
                // SAFETY: only whether there is an entry is read.
                None => (None, unsafe { ENDPOINTS_V4.get(src) }.is_some()),
            }
        }
        ETH_P_IPV6 => {
            let Ok(ip) = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN) else {
                return TunnelSource::Other;
            };
            // SAFETY: bounds checked by `header_at`.
            let src = unsafe { (*ip).src_addr };
            match REMOTE_CIDRS_V6.get(&Key::new(128, src)) {
                Some(node) => (Some(node), false),
                // SAFETY: as above.
                None => (None, unsafe { ENDPOINTS_V6.get(src) }.is_some()),
            }
        }
        _ => return TunnelSource::Other,
    };
    match node {
        Some(node) => {
            // SAFETY: a valid map value for the program's run, copied at once.
            let node = unsafe { core::ptr::read_volatile(node) };
            if node.flags & REMOTE_F_TUNNEL != 0
                && node.family == family
                && node.node_address == outer
            {
                TunnelSource::PeerPod
            } else {
                TunnelSource::Refused
            }
        }
        None if local => TunnelSource::Refused,
        None => TunnelSource::Other,
    }
}

/// The outer source address of a decapsulated packet (IPv4 in the first
/// four bytes) and its family, as `RemoteNode` holds a node's.
#[inline(always)]
fn outer_source(ctx: &TcContext) -> Option<([u8; 16], u32)> {
    let skb = ctx.skb.skb;
    let size = size_of::<bpf_tunnel_key>() as u32;
    // SAFETY: all-zero is a valid bpf_tunnel_key.
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    let mut address = [0u8; 16];
    // The helper refuses the wrong family (EPROTO): IPv4 asked first.
    // SAFETY: the skb pointer and a key of the size given.
    if unsafe { bpf_skb_get_tunnel_key(skb, &mut key, size, 0) } == 0 {
        // SAFETY: the helper filled the IPv4 member (host byte order).
        let v4 = unsafe { key.__bindgen_anon_1.remote_ipv4 }.to_be_bytes();
        address[..4].copy_from_slice(&v4);
        return Some((address, AF_INET_VALUE));
    }
    // SAFETY: as above.
    if unsafe { bpf_skb_get_tunnel_key(skb, &mut key, size, u64::from(BPF_F_TUNINFO_IPV6)) } == 0 {
        // SAFETY: the helper filled the IPv6 member (network byte order).
        let words = unsafe { key.__bindgen_anon_1.remote_ipv6 };
        for (i, word) in words.iter().enumerate() {
            address[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        return Some((address, AF_INET6_VALUE));
    }
    None
}

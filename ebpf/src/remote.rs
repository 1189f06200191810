//! A pod's packet for another node: sent out the way the kernel's FIB
//! says, or left to the host stack.

use aya_ebpf::bindings::bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS;
use aya_ebpf::bindings::{
    BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup, bpf_redir_neigh,
};
use aya_ebpf::helpers::generated::{
    bpf_check_mtu, bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh,
};
use aya_ebpf::programs::TcContext;
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::packet::{decrement_ttl, header_at, zero_words};
use crate::proto::{AF_INET, AF_INET6, ETH_P_IP, ETH_P_IPV6};

/// `bpf_check_mtu`'s BPF_MTU_CHK_SEGS: a GSO packet is judged by its
/// segments (without it every GSO packet passes).
pub(crate) const MTU_CHECK_SEGMENTS: u64 =
    aya_ebpf::bindings::bpf_check_mtu_flags::BPF_MTU_CHK_SEGS as u64;

/// Traffic class and flow label of the first IPv6 header word (network order).
pub(crate) const IPV6_FLOWINFO_MASK: u32 = 0x0fff_ffff_u32.to_be();

/// Sends a pod's packet for another node the way the kernel's FIB says
/// (the agent's route via that node), with the next hop's MAC the FIB
/// found, or, when it has none yet, resolved by `bpf_redirect_neigh`.
/// None: the host stack must take it (no route, forwarding off, TTL
/// expiring, too big for the way out). `lookup_flags`: 0 routes the packet
/// as forwarded from `ingress`; `BPF_FIB_LOOKUP_OUTPUT` as sent by the node
/// itself out of `ingress` (a packet the NodePort path gave a node source).
#[inline(always)]
pub(crate) fn route_to_remote(ctx: &TcContext, ingress: u32, lookup_flags: u32) -> Option<i32> {
    let (start, end) = (ctx.data(), ctx.data_end());
    let eth: *mut EthHdr = header_at(start, end, 0).ok()?;
    let mut params = core::mem::MaybeUninit::<bpf_fib_lookup>::uninit();
    zero_words(params.as_mut_ptr());
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and
    // unions of them), and every word was just written.
    let params = unsafe { params.assume_init_mut() };
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
            params,
            size_of::<bpf_fib_lookup>() as i32,
            lookup_flags,
        )
    };
    if found == i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
        // The way out and the next hop are known, the next hop's MAC not
        // yet: bpf_redirect_neigh resolves it as the stack would. The FIB
        // checks the MTU only on SUCCESS, so it is checked here (a GSO packet by its segments).
        let mut mtu_len: u32 = 0;
        // SAFETY: the skb pointer and a u32 the helper writes the MTU to.
        let fits = unsafe {
            bpf_check_mtu(
                ctx.skb.skb as *mut _,
                params.ifindex,
                &mut mtu_len,
                0,
                MTU_CHECK_SEGMENTS,
            )
        };
        if fits != i64::from(BPF_MTU_CHK_RET_SUCCESS) {
            return None;
        }
    } else if found != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return None;
    }
    // Only now, when the packet is surely forwarded here, is it changed.
    take_hop(start, end, family == AF_INET)?;
    if found == i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        // The FIB resolved the next hop's MAC too: write the frame as the
        // stack would and send it, without a second neighbour lookup.
        // Written as non-overlapping copies: a plain assignment from the
        // parameters becomes a call of a byte-wise memmove here.
        // SAFETY: bounds checked above; the frame is writable; the
        // parameters live on the stack, apart from the packet.
        unsafe {
            core::ptr::write_unaligned(&raw mut (*eth).dst_addr, params.dmac);
            core::ptr::write_unaligned(&raw mut (*eth).src_addr, params.smac);
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

/// One routing hop on a packet the datapath forwards itself (to another
/// node, or into the tunnel): IPv4's TTL (checksum patched) or IPv6's hop
/// limit less one. None: the header is not there.
#[inline(always)]
pub(crate) fn take_hop(start: usize, end: usize, ipv4: bool) -> Option<()> {
    if ipv4 {
        let ip: *mut Ipv4Hdr = header_at(start, end, EthHdr::LEN).ok()?;
        // SAFETY: bounds checked by `header_at`; the frame is writable.
        decrement_ttl(unsafe { &mut *ip });
    } else {
        let ip: *mut Ipv6Hdr = header_at(start, end, EthHdr::LEN).ok()?;
        // SAFETY: as above.
        unsafe { (*ip).hop_limit -= 1 };
    }
    Some(())
}

/// An IPv6 address as the four 32-bit words the FIB helper takes.
#[inline(always)]
pub(crate) fn words(address: [u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([address[0], address[1], address[2], address[3]]),
        u32::from_ne_bytes([address[4], address[5], address[6], address[7]]),
        u32::from_ne_bytes([address[8], address[9], address[10], address[11]]),
        u32::from_ne_bytes([address[12], address[13], address[14], address[15]]),
    ]
}

//! ICMP errors about a translated flow's packets (kube-proxy's conntrack
//! relates them to the connection and NATs them back): a backend's port
//! unreachable, a router's fragmentation needed or packet too big, reach
//! the flow's client as they would through kube-proxy's rules.

use aya_ebpf::{
    bindings::BPF_F_PSEUDO_HDR, helpers::generated::bpf_csum_diff, programs::TcContext,
};

use super::{IPPROTO_TCP, IPPROTO_UDP, Scratch};
use crate::remote::words;
use crate::*;

/// An ICMP error (destination unreachable, fragmentation needed or packet
/// too big, time exceeded, parameter problem) at `icmp`, about a TCP or
/// UDP packet: its key is the flow of the packet it quotes, seen from the
/// other end (for a translated flow's packet, the flow's reply tuple), as
/// conntrack relates such an error to the connection.
#[inline(always)]
pub(super) fn parse_error(ctx: &TcContext, s: &mut Scratch, icmp: usize) -> Option<()> {
    let (start, end) = (ctx.data(), ctx.data_end());
    let kind: *const u8 = header_at(start, end, icmp).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let kind = unsafe { *kind };
    let ipv4 = s.key.family == 4;
    let error = if ipv4 {
        matches!(kind, 3 | 11 | 12)
    } else {
        matches!(kind, 1..=4)
    };
    if !error {
        return None;
    }
    let quoted = icmp + 8;
    let key = &mut s.key;
    let quoted_l4 = if ipv4 {
        let ip: *const Ipv4Hdr = header_at(start, end, quoted).ok()?;
        // SAFETY: bounds checked by `header_at`.
        let ip = unsafe { &*ip };
        // A quoted packet with options or past a first fragment has no
        // ports where this looks.
        if ip.vihl != 0x45 || u16::from_be_bytes(ip.frags) & 0x1fff != 0 {
            return None;
        }
        key.src = [0; 16];
        key.dst = [0; 16];
        key.src[..4].copy_from_slice(&ip.dst_addr);
        key.dst[..4].copy_from_slice(&ip.src_addr);
        key.protocol = ip.proto;
        quoted + Ipv4Hdr::LEN
    } else {
        let ip: *const Ipv6Hdr = header_at(start, end, quoted).ok()?;
        // SAFETY: bounds checked by `header_at`.
        let ip = unsafe { &*ip };
        key.src = ip.dst_addr;
        key.dst = ip.src_addr;
        key.protocol = ip.next_hdr;
        quoted + Ipv6Hdr::LEN
    };
    if key.protocol != IPPROTO_TCP && key.protocol != IPPROTO_UDP {
        return None;
    }
    let ports: *const [u8; 4] = header_at(start, end, quoted_l4).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let ports = unsafe { *ports };
    key.src_port = [ports[2], ports[3]];
    key.dst_port = [ports[0], ports[1]];
    s.l4 = quoted_l4 as u32;
    s.icmp = icmp as u32;
    s.closing = 0;
    Some(())
}

/// Which end of a packet a patch sets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Source,
    Destination,
}

/// Makes the error the client's: the quoted packet's source becomes the
/// client and its destination the frontend (its IPv4 header checksum and,
/// when quoted and in use, its transport checksum patched); the error goes
/// to the client, and comes from the frontend when the backend sent it.
/// Every change inside the ICMP message is carried into its checksum.
/// The work is split into calls of their own, each reading what it needs
/// from `s`: a program's calls share 512 bytes of stack. None: a helper
/// refused.
#[inline(never)]
pub(super) fn rewrite_error(ctx: &TcContext, s: &mut Scratch) -> Option<()> {
    let ipv4 = s.key.family == 4;
    let l4_csum = s.l4 + if s.key.protocol == IPPROTO_TCP { 16 } else { 6 };
    // The error may quote only the first 8 bytes of a TCP header; a UDP
    // checksum of 0 over IPv4 is none.
    s.quoted_l4_csum = match ctx.load::<u16>(l4_csum as usize) {
        Ok(0) if ipv4 && s.key.protocol == IPPROTO_UDP => 0,
        Ok(_) => l4_csum,
        Err(_) => 0,
    };
    s.quoted_csums = quoted_checksums(ctx, s);
    patch_quoted_address(ctx, s, End::Source)?;
    patch_quoted_address(ctx, s, End::Destination)?;
    patch_quoted_port(ctx, s, End::Source)?;
    patch_quoted_port(ctx, s, End::Destination)?;
    carry_quoted_checksums(ctx, s)?;
    // The error's own ends: to the client, from the frontend if the
    // backend sent it (a router on the way keeps its address).
    set_outer(ctx, s, End::Destination)?;
    if sent_by_backend(ctx, s)? {
        set_outer(ctx, s, End::Source)?;
    }
    Some(())
}

/// What the quoted packet's `end` becomes: the client, or the frontend.
#[inline(always)]
fn new_end(s: &Scratch, end: End) -> (&[u8; 16], [u8; 2]) {
    match end {
        End::Source => (&s.reverse.client, s.reverse.client_port),
        End::Destination => (&s.reverse.frontend, s.reverse.frontend_port),
    }
}

/// An IPv4 address's 4 bytes (of the 16 a key holds) as loaded.
#[inline(always)]
fn four(address: &[u8; 16]) -> u32 {
    u32::from_ne_bytes([address[0], address[1], address[2], address[3]])
}

/// The quoted packet's IPv4 header checksum and transport checksum as they
/// are (0 where absent or not patched).
#[inline(never)]
fn quoted_checksums(ctx: &TcContext, s: &Scratch) -> [u16; 2] {
    let ip = if s.key.family == 4 {
        ctx.load::<u16>(s.icmp as usize + 8 + 10).unwrap_or(0)
    } else {
        0
    };
    let l4 = match s.quoted_l4_csum {
        0 => 0,
        at => ctx.load::<u16>(at as usize).unwrap_or(0),
    };
    [ip, l4]
}

/// The quoted checksums' own changes, into the ICMP message's checksum.
#[inline(never)]
fn carry_quoted_checksums(ctx: &TcContext, s: &Scratch) -> Option<()> {
    let after = quoted_checksums(ctx, s);
    for (old, new) in s.quoted_csums.into_iter().zip(after) {
        if old != new {
            ctx.l4_csum_replace(s.icmp as usize + 2, u64::from(old), u64::from(new), 2)
                .ok()?;
        }
    }
    Some(())
}

/// Sets the quoted packet's `end` address; its checksums and the ICMP
/// message's patched.
#[inline(never)]
fn patch_quoted_address(ctx: &TcContext, s: &Scratch, end: End) -> Option<()> {
    let quoted = s.icmp as usize + 8;
    let icmp_csum = s.icmp as usize + 2;
    let (address, _) = new_end(s, end);
    if s.key.family == 4 {
        let at = quoted + if end == End::Source { 12 } else { 16 };
        let old: u32 = ctx.load(at).ok()?;
        let new = four(address);
        if old == new {
            return Some(());
        }
        ctx.store(at, &new, 0).ok()?;
        ctx.l3_csum_replace(quoted + 10, u64::from(old), u64::from(new), 4)
            .ok()?;
        if s.quoted_l4_csum != 0 {
            // Plain arithmetic on a checksum inside the payload.
            ctx.l3_csum_replace(s.quoted_l4_csum as usize, u64::from(old), u64::from(new), 4)
                .ok()?;
        }
        ctx.l4_csum_replace(icmp_csum, u64::from(old), u64::from(new), 4)
            .ok()
    } else {
        let at = quoted + if end == End::Source { 8 } else { 24 };
        let mut old: [u32; 4] = ctx.load(at).ok()?;
        let mut new = words(*address);
        if old == new {
            return Some(());
        }
        // SAFETY: two 16-byte buffers on the stack, as the sizes say.
        let diff = unsafe { bpf_csum_diff(old.as_mut_ptr(), 16, new.as_mut_ptr(), 16, 0) } as u64;
        ctx.store(at, &new, 0).ok()?;
        if s.quoted_l4_csum != 0 {
            ctx.l3_csum_replace(s.quoted_l4_csum as usize, 0, diff, 0)
                .ok()?;
        }
        ctx.l4_csum_replace(icmp_csum, 0, diff, 0).ok()
    }
}

/// Sets the quoted packet's `end` port; its transport checksum and the
/// ICMP message's patched.
#[inline(never)]
fn patch_quoted_port(ctx: &TcContext, s: &Scratch, end: End) -> Option<()> {
    let at = s.l4 as usize + if end == End::Source { 0 } else { 2 };
    let old: u16 = ctx.load(at).ok()?;
    let new = u16::from_ne_bytes(new_end(s, end).1);
    if old == new {
        return Some(());
    }
    ctx.store(at, &new, 0).ok()?;
    if s.quoted_l4_csum != 0 {
        ctx.l3_csum_replace(s.quoted_l4_csum as usize, u64::from(old), u64::from(new), 2)
            .ok()?;
    }
    ctx.l4_csum_replace(s.icmp as usize + 2, u64::from(old), u64::from(new), 2)
        .ok()
}

/// Where the error's own `end` address is.
#[inline(always)]
fn outer_at(ipv4: bool, end: End) -> usize {
    EthHdr::LEN
        + match (ipv4, end) {
            (true, End::Source) => 12,
            (true, End::Destination) => 16,
            (false, End::Source) => 8,
            (false, End::Destination) => 24,
        }
}

/// Whether the flow's backend sent the error (the quoted packet's
/// destination is the error's source).
#[inline(never)]
fn sent_by_backend(ctx: &TcContext, s: &Scratch) -> Option<bool> {
    let at = outer_at(s.key.family == 4, End::Source);
    Some(if s.key.family == 4 {
        ctx.load::<u32>(at).ok()? == four(&s.key.src)
    } else {
        ctx.load::<[u32; 4]>(at).ok()? == words(s.key.src)
    })
}

/// Sets the error's own `end`: the destination to the client, the source
/// to the frontend; the IPv4 header's checksum patched, or, over IPv6, the
/// ICMPv6 checksum (its pseudo-header holds the addresses).
#[inline(never)]
fn set_outer(ctx: &TcContext, s: &Scratch, end: End) -> Option<()> {
    let ipv4 = s.key.family == 4;
    let at = outer_at(ipv4, end);
    let address = match end {
        End::Destination => &s.reverse.client,
        End::Source => &s.reverse.frontend,
    };
    if ipv4 {
        let old: u32 = ctx.load(at).ok()?;
        let new = four(address);
        if old != new {
            ctx.store(at, &new, 0).ok()?;
            ctx.l3_csum_replace(EthHdr::LEN + 10, u64::from(old), u64::from(new), 4)
                .ok()?;
        }
    } else {
        let mut old: [u32; 4] = ctx.load(at).ok()?;
        let mut new = words(*address);
        if old != new {
            // SAFETY: two 16-byte buffers on the stack, as the sizes say.
            let diff =
                unsafe { bpf_csum_diff(old.as_mut_ptr(), 16, new.as_mut_ptr(), 16, 0) } as u64;
            ctx.store(at, &new, 0).ok()?;
            ctx.l4_csum_replace(s.icmp as usize + 2, 0, diff, u64::from(BPF_F_PSEUDO_HDR))
                .ok()?;
        }
    }
    Some(())
}

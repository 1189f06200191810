//! ICMP errors about a translated flow's packets, either way (kube-proxy's
//! conntrack relates them to the connection and NATs them back): a
//! backend's port unreachable, or a router's fragmentation needed or
//! packet too big, reaches the flow's client; a client's port unreachable
//! for a late reply, or a router's packet too big for a large one, reaches
//! the backend; each as through kube-proxy's rules.

use aya_ebpf::bindings::BPF_F_PSEUDO_HDR;
use aya_ebpf::helpers::generated::bpf_csum_diff;
use aya_ebpf::programs::TcContext;
use network_types::eth::EthHdr;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::maps::nodeport::Scratch;
use crate::packet::header_at;
use crate::proto::{FRAGMENT_HEADER_LEN, IPPROTO_FRAGMENT, IPPROTO_TCP, IPPROTO_UDP};
use crate::remote::words;

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
        let l4 = quoted + Ipv6Hdr::LEN;
        if key.protocol == IPPROTO_FRAGMENT {
            // A quoted first fragment (a router's packet too big for it,
            // say) has its ports past its fragment header; a later one has
            // none.
            let fragment: *const [u8; 4] = header_at(start, end, l4).ok()?;
            // SAFETY: bounds checked by `header_at`.
            let fragment = unsafe { *fragment };
            if u16::from_be_bytes([fragment[2], fragment[3]]) & 0xfff8 != 0 {
                return None;
            }
            key.protocol = fragment[0];
            l4 + FRAGMENT_HEADER_LEN
        } else {
            l4
        }
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

/// An error about a flow's packet to its client (from the backend, or a
/// router on the way) goes to the client: the quoted packet the client's
/// again (from the client, to the frontend), and from the frontend when
/// the backend sent it. `s.reverse` holds the flow.
#[inline(always)]
pub(super) fn toward_client(s: &mut Scratch) {
    let e = &mut s.error;
    e.quoted_source = s.reverse.client;
    e.quoted_source_port = s.reverse.client_port;
    e.quoted_destination = s.reverse.frontend;
    e.quoted_destination_port = s.reverse.frontend_port;
    e.to = s.reverse.client;
    e.other_end = s.key.src;
    e.other_end_becomes = s.reverse.frontend;
}

/// An error about a reply of the flow (from the client, or a router on
/// the way; it came to the frontend) goes to the backend: the quoted reply
/// made the backend's again (from the backend, to the node port the flow
/// was given, or the client's own address when it was kept), and from
/// that address when the client sent it. `s.forward` holds the flow; the
/// key is the client's tuple.
#[inline(always)]
pub(super) fn toward_backend(s: &mut Scratch) {
    let translated = s.forward.nat_port != [0; 2];
    let e = &mut s.error;
    e.quoted_source = s.forward.backend;
    e.quoted_source_port = s.forward.backend_port;
    (e.quoted_destination, e.quoted_destination_port) = if translated {
        (s.nat_source, s.forward.nat_port)
    } else {
        (s.key.src, s.key.src_port)
    };
    e.to = s.forward.backend;
    e.other_end = s.key.src;
    e.other_end_becomes = e.quoted_destination;
}

/// Which end of a packet a patch sets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Source,
    Destination,
}

/// Rewrites the error as `s.error` says: the quoted packet's ends (its
/// IPv4 header checksum and, when quoted and in use, its transport
/// checksum patched), where the error goes, and its sender when that is
/// the flow's other end. Every change inside the ICMP message is carried
/// into its checksum.
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
    // The error's own ends (a router on the way keeps its address).
    set_outer(ctx, s, End::Destination)?;
    if sent_by_other_end(ctx, s)? {
        set_outer(ctx, s, End::Source)?;
    }
    Some(())
}

/// What the quoted packet's `end` becomes.
#[inline(always)]
fn new_end(s: &Scratch, end: End) -> (&[u8; 16], [u8; 2]) {
    match end {
        End::Source => (&s.error.quoted_source, s.error.quoted_source_port),
        End::Destination => (&s.error.quoted_destination, s.error.quoted_destination_port),
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

/// Whether the flow's other end (the quoted packet's destination) sent
/// the error.
#[inline(never)]
fn sent_by_other_end(ctx: &TcContext, s: &Scratch) -> Option<bool> {
    let at = outer_at(s.key.family == 4, End::Source);
    Some(if s.key.family == 4 {
        ctx.load::<u32>(at).ok()? == four(&s.error.other_end)
    } else {
        ctx.load::<[u32; 4]>(at).ok()? == words(s.error.other_end)
    })
}

/// Sets the error's own `end` as `s.error` says; the IPv4 header's
/// checksum patched, or, over IPv6, the ICMPv6 checksum (its pseudo-header
/// holds the addresses).
#[inline(never)]
fn set_outer(ctx: &TcContext, s: &Scratch, end: End) -> Option<()> {
    let ipv4 = s.key.family == 4;
    let at = outer_at(ipv4, end);
    let address = match end {
        End::Destination => &s.error.to,
        End::Source => &s.error.other_end_becomes,
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

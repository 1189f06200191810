//! The rewrite of a translated packet's ends (addresses and ports) in
//! place, and its checksums (RFC 1624).

use aya_ebpf::bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR};
use aya_ebpf::programs::TcContext;
use flatnet_common::{NatForward, NatKey, NatReverse};
use network_types::eth::EthHdr;

use crate::maps::nodeport::{FRAGMENT_LATER, Scratch};
use crate::packet::header_at;
use crate::proto::IPPROTO_TCP;

/// Where a rewrite sends a translated packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Toward {
    /// To the flow's backend (`s.forward`), from its node port when the
    /// flow has one (`s.nat_source`).
    Backend,
    /// A reply, to the client (`s.reverse`), from the frontend.
    Client,
}

/// Sets both ends of the packet at once, as `toward` says, in place
/// (direct packet access: `parse` read the same headers there, and no
/// helper has moved the packet since). The checksum differences are computed
/// here (RFC 1624) from the ends `parse` read (`s.key`): the addresses'
/// (into the IPv4 header's, written here, and the transport's through its
/// pseudo-header) and the ports'. Only the transport checksum goes
/// through a helper, once per difference: the kernel knows how the skb
/// carries it (a partial checksum of a locally sent packet holds only the
/// pseudo-header's sum, which the ports are not part of). None: the
/// headers are not there or a helper refused (the packet is then dropped).
#[inline(never)]
pub(crate) fn rewrite(ctx: &TcContext, s: &mut Scratch, toward: Toward) -> Option<()> {
    // Where the new ends are in the scratch area (pointers, not copies:
    // the program's calls share 512 bytes of stack); a kept source points
    // at the packet's own (`s.key`).
    let (source, destination, ports): (*const [u8; 16], *const [u8; 16], [[u8; 2]; 2]) =
        match toward {
            Toward::Backend if s.forward.nat_port != [0; 2] => (
                &raw const s.nat_source,
                &raw const s.forward.backend,
                [s.forward.nat_port, s.forward.backend_port],
            ),
            Toward::Backend => (
                &raw const s.key.src,
                &raw const s.forward.backend,
                [s.key.src_port, s.forward.backend_port],
            ),
            Toward::Client => (
                &raw const s.reverse.frontend,
                &raw const s.reverse.client,
                [s.reverse.frontend_port, s.reverse.client_port],
            ),
        };
    let ipv4 = s.key.family == 4;
    let words = if ipv4 { 1 } else { 4 };
    let mut ends_diff = 0;
    let mut ends_changed = false;
    for i in 0..words {
        // SAFETY: word `i` of 16-byte addresses in the scratch area, at
        // offsets `SCRATCH_ALIGNED` proves aligned.
        let (old_source, old_destination, new_source, new_destination) = unsafe {
            (
                aligned_word(&raw const s.key.src, i),
                aligned_word(&raw const s.key.dst, i),
                aligned_word(source, i),
                aligned_word(destination, i),
            )
        };
        ends_changed |= old_source != new_source || old_destination != new_destination;
        ends_diff = csum_add(
            csum_add(
                csum_add(csum_add(ends_diff, !old_source), new_source),
                !old_destination,
            ),
            new_destination,
        );
    }
    let ports_old = u32::from_ne_bytes([
        s.key.src_port[0],
        s.key.src_port[1],
        s.key.dst_port[0],
        s.key.dst_port[1],
    ]);
    let [source_port, destination_port] = ports;
    let ports_new = u32::from_ne_bytes([
        source_port[0],
        source_port[1],
        destination_port[0],
        destination_port[1],
    ]);
    // A later fragment has no transport header (the first one's checksum
    // covers the whole datagram).
    let later_fragment = s.fragment == FRAGMENT_LATER;
    let ports_changed = !later_fragment && ports_new != ports_old;
    // Bounded for the verifier: a transport header starts within the
    // first 255 bytes (`parse` took no other).
    let l4 = (s.l4 & 0xff) as usize;
    if !later_fragment {
        let (checksum_at, mangled_zero) = if s.key.protocol == IPPROTO_TCP {
            (l4 + 16, 0)
        } else {
            // A UDP checksum of 0 (none, over IPv4) stays 0.
            (l4 + 6, u64::from(BPF_F_MARK_MANGLED_0))
        };
        if ends_changed {
            ctx.l4_csum_replace(
                checksum_at,
                0,
                u64::from(ends_diff),
                u64::from(BPF_F_PSEUDO_HDR) | mangled_zero,
            )
            .ok()?;
        }
        if ports_changed {
            let ports_diff = csum_add(!ports_old, ports_new);
            ctx.l4_csum_replace(checksum_at, 0, u64::from(ports_diff), mangled_zero)
                .ok()?;
            let ports: *mut u32 = header_at(ctx.data(), ctx.data_end(), l4).ok()?;
            // SAFETY: bounds checked by `header_at`; the frame is writable.
            unsafe { core::ptr::write_unaligned(ports, ports_new) };
        }
    }
    if !ends_changed {
        return Some(());
    }
    if ipv4 {
        let header: *mut [u8; 12] = header_at(ctx.data(), ctx.data_end(), EthHdr::LEN + 8).ok()?;
        // SAFETY: bounds checked by `header_at` (TTL to the destination);
        // the frame is writable; scratch words as above.
        unsafe {
            let header = header.cast::<u8>();
            let checksum = header.add(2).cast::<[u8; 2]>();
            let old = u16::from_ne_bytes(*checksum);
            *checksum = csum_fold(csum_add(ends_diff, !u32::from(old))).to_ne_bytes();
            core::ptr::write_unaligned(header.add(4).cast::<u32>(), aligned_word(source, 0));
            core::ptr::write_unaligned(header.add(8).cast::<u32>(), aligned_word(destination, 0));
        }
    } else {
        // The addresses, source then destination, from byte 8 of the header.
        let ends: *mut [u32; 8] = header_at(ctx.data(), ctx.data_end(), EthHdr::LEN + 8).ok()?;
        for i in 0..4 {
            // SAFETY: as above.
            unsafe {
                core::ptr::write_unaligned(ends.cast::<u32>().add(i), aligned_word(source, i));
                core::ptr::write_unaligned(
                    ends.cast::<u32>().add(4 + i),
                    aligned_word(destination, i),
                );
            }
        }
    }
    Some(())
}

/// Word `i` of the 16-byte address at `address`.
///
/// # Safety
/// `address` points into the scratch area at a 4-aligned offset
/// (`SCRATCH_ALIGNED`), and `i` < 4.
#[inline(always)]
unsafe fn aligned_word(address: *const [u8; 16], i: usize) -> u32 {
    // SAFETY: the caller's promise; the map value is 8-aligned.
    unsafe { *address.cast::<u32>().add(i) }
}

// SCRATCH_ALIGNED: the scratch addresses `rewrite` reads a word at a time
// lie at 4-aligned offsets of a 4-aligned struct.
const _: () = {
    use core::mem::offset_of;
    assert!(align_of::<Scratch>() >= 4);
    assert!(offset_of!(Scratch, key) % 4 == 0);
    assert!(offset_of!(NatKey, src) % 4 == 0 && offset_of!(NatKey, dst) % 4 == 0);
    assert!(offset_of!(Scratch, nat_source) % 4 == 0);
    assert!((offset_of!(Scratch, forward) + offset_of!(NatForward, backend)) % 4 == 0);
    assert!(offset_of!(Scratch, reverse) % 4 == 0);
    assert!(offset_of!(NatReverse, client) % 4 == 0 && offset_of!(NatReverse, frontend) % 4 == 0);
};

/// One's-complement addition, as the kernel's `csum_add`.
#[inline(always)]
fn csum_add(sum: u32, value: u32) -> u32 {
    let (added, carry) = sum.overflowing_add(value);
    added.wrapping_add(u32::from(carry))
}

/// A 32-bit one's-complement sum folded to 16 bits and inverted: a
/// checksum field's value, as the kernel's `csum_fold`.
#[inline(always)]
fn csum_fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

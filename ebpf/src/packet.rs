//! Reading and writing in place: a header at an offset of the packet, a
//! map entry copied once, a word-wise zeroing, a routing hop's TTL.

use core::mem::size_of;

use flatnet_common::Endpoint;
use network_types::ip::Ipv4Hdr;

/// A pointer to a `T` at `offset` into the packet, if the packet is long enough.
#[inline(always)]
pub(crate) fn header_at<T>(start: usize, end: usize, offset: usize) -> Result<*mut T, ()> {
    if start + offset + size_of::<T>() > end {
        return Err(());
    }
    Ok((start + offset) as *mut T)
}

/// The map entry read once, into the program's stack: a hash map slot can
/// be reused by a concurrent update, and a plain copy would let the compiler
/// read the fields from the map later (and, not knowing the slot from the
/// packet, copy MACs with a `memmove` call).
#[inline(always)]
pub(crate) fn snapshot(entry: &Endpoint) -> Endpoint {
    // SAFETY: `entry` is a valid, aligned map value for the program's run.
    unsafe { core::ptr::read_volatile(entry) }
}

/// One routing hop: TTL minus one, header checksum patched as the kernel's
/// `ip_decrease_ttl` does (RFC 1624: the TTL is the high byte of its word).
#[inline(always)]
pub(crate) fn decrement_ttl(ip: &mut Ipv4Hdr) {
    let sum = u32::from(u16::from_be_bytes(ip.check)) + 0x0100;
    let sum = sum + u32::from(sum >= 0xffff);
    ip.check = (sum as u16).to_be_bytes();
    ip.ttl -= 1;
}

/// `*value` set to all zeroes a word at a time. `mem::zeroed` compiles to
/// a call of a `memset` that stores one byte per loop round here (64
/// rounds for a FIB lookup's parameters, on every routed packet).
/// `T` must be a plain-integer struct for which all-zero is valid.
#[inline(always)]
pub(crate) fn zero_words<T>(value: *mut T) {
    const {
        assert!(size_of::<T>() % 4 == 0 && align_of::<T>() >= 4);
    }
    for i in 0..size_of::<T>() / 4 {
        // SAFETY: word `i` of `*value`, which is aligned and this long.
        unsafe { core::ptr::write_volatile(value.cast::<u32>().add(i), 0) };
    }
}

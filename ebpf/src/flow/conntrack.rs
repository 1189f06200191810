//! Asking the kernel's conntrack table about a flow (the kfuncs, from tc
//! and XDP): nothing, tracked, or tracked with a translation.

use aya_ebpf::programs::{TcContext, XdpContext};

use crate::flow::Flow;
use crate::kfunc::{CtOpts, ct_release, skb_ct_lookup, xdp_ct_lookup};
use crate::proto::Ports;

/// A program context that can ask the kernel's conntrack table.
pub trait Conntrack {
    /// True when the table has an entry with `tuple` in either direction.
    fn has_entry<T>(&self, tuple: &T, l4proto: u8) -> bool;
}

impl Conntrack for TcContext {
    #[inline(always)]
    fn has_entry<T>(&self, tuple: &T, l4proto: u8) -> bool {
        let mut opts = CtOpts::new(l4proto);
        // SAFETY: our own context, an initialised tuple and options on the stack.
        let entry = unsafe {
            skb_ct_lookup(
                self.skb.skb as *mut u8,
                tuple as *const T as *const u8,
                size_of::<T>() as u64,
                &mut opts,
            )
        };
        release(entry)
    }
}

impl Conntrack for XdpContext {
    #[inline(always)]
    fn has_entry<T>(&self, tuple: &T, l4proto: u8) -> bool {
        let mut opts = CtOpts::new(l4proto);
        // SAFETY: as above, for XDP.
        let entry = unsafe {
            xdp_ct_lookup(
                self.ctx as *mut u8,
                tuple as *const T as *const u8,
                size_of::<T>() as u64,
                &mut opts,
            )
        };
        release(entry)
    }
}

/// Drops a lookup's reference; true when there was an entry.
#[inline(always)]
pub(super) fn release(entry: u64) -> bool {
    if entry == 0 {
        return false;
    }
    // SAFETY: a non-zero lookup result, released once.
    unsafe { ct_release(entry) };
    true
}

/// `struct bpf_sock_tuple`'s IPv4 form, network byte order.
#[repr(C, align(4))]
pub(super) struct TupleV4 {
    pub(super) src: [u8; 4],
    pub(super) dst: [u8; 4],
    pub(super) sport: [u8; 2],
    pub(super) dport: [u8; 2],
}
const _: () = assert!(size_of::<TupleV4>() == 12);

impl TupleV4 {
    /// The tuple of a packet from `src` to `dst` with these ports.
    #[inline(always)]
    pub(super) fn of(src: [u8; 4], dst: [u8; 4], ports: &Ports) -> Self {
        TupleV4 {
            src,
            dst,
            sport: ports.src,
            dport: ports.dst,
        }
    }
}

/// `struct bpf_sock_tuple`'s IPv6 form.
#[repr(C, align(4))]
pub(super) struct TupleV6 {
    pub(super) src: [u8; 16],
    pub(super) dst: [u8; 16],
    pub(super) sport: [u8; 2],
    pub(super) dport: [u8; 2],
}
const _: () = assert!(size_of::<TupleV6>() == 36);

impl TupleV6 {
    #[inline(always)]
    pub(super) fn of(src: [u8; 16], dst: [u8; 16], ports: &Ports) -> Self {
        TupleV6 {
            src,
            dst,
            sport: ports.src,
            dport: ports.dst,
        }
    }
}

/// A `struct bpf_sock_tuple` form: the same flow's other direction.
pub(super) trait Tuple {
    fn reversed(&self) -> Self;
}

impl Tuple for TupleV4 {
    #[inline(always)]
    fn reversed(&self) -> Self {
        TupleV4 {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }
}

impl Tuple for TupleV6 {
    #[inline(always)]
    fn reversed(&self) -> Self {
        TupleV6 {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }
}

/// What the table says of the flow whose packets look like `forward`:
/// nothing, tracked, or tracked with a translation (no entry for the
/// reverse of `forward`).
#[inline(always)]
pub(super) fn judge<T: Tuple>(ct: &impl Conntrack, proto: u8, forward: T) -> Flow {
    if !ct.has_entry(&forward, proto) {
        return Flow::Clear;
    }
    if ct.has_entry(&forward.reversed(), proto) {
        Flow::Tracked
    } else {
        Flow::Translated
    }
}

//! Calls into the kernel's conntrack table (the `bpf_skb_ct_lookup`,
//! `bpf_xdp_ct_lookup` and `bpf_ct_release` kfuncs, Linux 6.0+).
//!
//! A kfunc call is a `call` instruction whose source register is
//! `BPF_PSEUDO_KFUNC_CALL` (2) and whose immediate is the function's BTF id
//! in the running kernel. Neither rustc nor aya 0.14 emits or resolves
//! those, so each call here is written as the raw instruction with a
//! placeholder immediate (`KFUNC_*`); the loader (plugin `datapath::kfuncs`)
//! replaces each placeholder with the id it finds in /sys/kernel/btf/vmlinux
//! before the object reaches the verifier. The verifier then checks every
//! call against the kernel's own prototype, as it would for C.

use core::arch::asm;

pub use flatnet_common::kfunc::{KFUNC_CT_RELEASE, KFUNC_SKB_CT_LOOKUP, KFUNC_XDP_CT_LOOKUP};

/// `struct bpf_ct_opts`: 16 bytes in the kernels that added conntrack
/// zones to it, 12 before. Calls pass 12 (`CT_OPTS_LEN`): the kernels
/// before zones refuse any other size, the later ones take both, and the
/// default zone (all zero) is what flatnet asks for either way.
#[repr(C, align(8))]
pub struct CtOpts {
    /// `BPF_F_CURRENT_NETNS`: the table of the namespace the packet is in.
    pub netns_id: i32,
    /// Written by the kernel when the lookup fails.
    pub error: i32,
    /// `l4proto` in the first byte (little endian), then `dir` (written by
    /// the kernel), `ct_zone_id`, `ct_zone_dir` and three reserved bytes,
    /// all zero here: the default zone. One word, so that zeroing it takes
    /// one store and no `memset` call.
    pub proto_and_zone: u64,
}
pub const CT_OPTS_LEN: u64 = 12;
const _: () = assert!(core::mem::size_of::<CtOpts>() == 16);

/// `BPF_F_CURRENT_NETNS`.
const CURRENT_NETNS: i32 = -1;

impl CtOpts {
    pub fn new(l4proto: u8) -> Self {
        CtOpts {
            netns_id: CURRENT_NETNS,
            error: 0,
            proto_and_zone: u64::from(l4proto),
        }
    }
}

/// Looks `tuple` (`tuple_len` bytes of a `struct bpf_sock_tuple`) up in the
/// conntrack table; the returned `struct nf_conn *` (0: none) holds a
/// reference that `ct_release` must drop.
///
/// # Safety
/// `skb` must be the program's own context pointer, `tuple` and `opts` must
/// point to initialised stack memory of `tuple_len` and 16 bytes.
#[inline(always)]
pub unsafe fn skb_ct_lookup(
    skb: *mut u8,
    tuple: *const u8,
    tuple_len: u64,
    opts: *mut CtOpts,
) -> u64 {
    let found: u64;
    // SAFETY: a call instruction with the kfunc convention (arguments in
    // r1-r5, result in r0, r1-r5 clobbered); the verifier checks the rest.
    unsafe {
        asm!(
            ".byte 0x85, 0x20, 0x00, 0x00",
            ".long {id}",
            id = const KFUNC_SKB_CT_LOOKUP,
            inlateout("r1") skb => _,
            inlateout("r2") tuple => _,
            inlateout("r3") tuple_len => _,
            inlateout("r4") opts => _,
            inlateout("r5") CT_OPTS_LEN => _,
            lateout("r0") found,
        );
    }
    found
}

/// `skb_ct_lookup` for an XDP context.
///
/// # Safety
/// As `skb_ct_lookup`, with the XDP context pointer.
#[inline(always)]
pub unsafe fn xdp_ct_lookup(
    xdp: *mut u8,
    tuple: *const u8,
    tuple_len: u64,
    opts: *mut CtOpts,
) -> u64 {
    let found: u64;
    // SAFETY: as in `skb_ct_lookup`.
    unsafe {
        asm!(
            ".byte 0x85, 0x20, 0x00, 0x00",
            ".long {id}",
            id = const KFUNC_XDP_CT_LOOKUP,
            inlateout("r1") xdp => _,
            inlateout("r2") tuple => _,
            inlateout("r3") tuple_len => _,
            inlateout("r4") opts => _,
            inlateout("r5") CT_OPTS_LEN => _,
            lateout("r0") found,
        );
    }
    found
}

/// Drops the reference a lookup returned.
///
/// # Safety
/// `entry` must be a non-zero result of a lookup, released once.
#[inline(always)]
pub unsafe fn ct_release(entry: u64) {
    // SAFETY: as in `skb_ct_lookup`; one argument, no result.
    unsafe {
        asm!(
            ".byte 0x85, 0x20, 0x00, 0x00",
            ".long {id}",
            id = const KFUNC_CT_RELEASE,
            inlateout("r1") entry => _,
            lateout("r0") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        );
    }
}

//! `from_pod` cut down for a measurement (`flatnet_common::cost_variant`):
//! the loader of a measurement sets `COST_VARIANT`; flatnet's own loads
//! leave it 0, and the verifier, knowing the constant, prunes every path
//! the variant leaves out from the programs it runs (`redirect_only`, the
//! smallest, is in `entry::pod_veth`).

use crate::maps::endpoints::COST_VARIANT;

/// The variant this load runs.
#[inline(always)]
pub(crate) fn current() -> u32 {
    // SAFETY: a read of a constant the loader set (frozen .rodata).
    unsafe { core::ptr::read_volatile(&COST_VARIANT) }
}

/// True when this load leaves `part` (a `cost_variant`) out.
#[inline(always)]
pub(crate) fn without(part: u32) -> bool {
    current() == part
}

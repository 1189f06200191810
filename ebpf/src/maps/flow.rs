//! The flow verdicts kept from conntrack's answers (`FLOWS`, see `flow`),
//! and whether UDP's are kept (`UDP_FLOWS`).

use super::map;

/// Whether UDP answers are kept: set by the loader (1 where the kernel has
/// tcx, which puts `to_pod` and `to_uplink` on every way out of the stack;
/// see `flatnet_common::GLOBAL_UDP_FLOWS`). Without them a kept "clear"
/// could outlive the flow's turn to the stack, so every UDP packet asks
/// conntrack, as TCP's SYNs do.
#[unsafe(no_mangle)]
pub(crate) static UDP_FLOWS: u32 = 0;

map!(
    /// What conntrack said of each TCP and UDP flow direction (see above).
    FLOWS
);

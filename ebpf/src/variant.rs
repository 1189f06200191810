//! `from_pod` cut down for a measurement (`flatnet_common::cost_variant`):
//! the loader of a measurement sets `COST_VARIANT`; flatnet's own loads
//! leave it 0, and the verifier, knowing the constant, prunes every path
//! below from the programs it runs.

use crate::*;
use flatnet_common::cost_variant;

#[unsafe(no_mangle)]
static COST_VARIANT: u32 = cost_variant::FULL;

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

/// `cost_variant::REDIRECT_ONLY`: an IPv4 packet for a local pod goes into
/// it, everything else to the stack. No source check, flow, policy or
/// counter.
#[inline(always)]
pub(crate) fn redirect_only(ctx: &TcContext) -> i32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    let Ok(eth) = header_at::<EthHdr>(start, end, 0) else {
        return TC_NEXT;
    };
    // SAFETY: `header_at` checked the header lies inside the packet.
    if u16::from_be(unsafe { (*eth).ether_type }) != ETH_P_IP {
        return TC_NEXT;
    }
    let Ok(ip) = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN) else {
        return TC_NEXT;
    };
    // SAFETY: bounds checked; the entry is copied at once.
    let Some(peer) = (unsafe { ENDPOINTS_V4.get((*ip).dst_addr) }).map(snapshot) else {
        return TC_NEXT;
    };
    match pod::to_pod(eth, peer) {
        // SAFETY: plain helper call, as in `from_pod`.
        Decision::ToPod { host_ifindex, .. } => {
            (unsafe { bpf_redirect_peer(host_ifindex, 0) }) as i32
        }
        _ => TC_NEXT,
    }
}

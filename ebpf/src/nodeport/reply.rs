//! A translated flow's reply (or an ICMP error about its packet to the
//! backend) back to the client: from a local backend (`reply_from_pod`)
//! or another node, out of the uplink its flow came in by, or into the
//! tunnel.

use aya_ebpf::bindings::{BPF_FIB_LOOKUP_OUTPUT, TC_ACT_SHOT};
use aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns;
use aya_ebpf::programs::TcContext;
use flatnet_common::{FAST_PATH_MARK, NAT_F_CLIENT_KEPT, NatReverse, action};

use crate::counters::count;
use crate::maps::nodeport::{NAT_REVERSE, Scratch};
use crate::nodeport::parse::{keep_fragment_ports, parse, scratch};
use crate::nodeport::rewrite::{Toward, rewrite};
use crate::nodeport::{REFRESH_NS, TO_TUNNEL, icmp};
use crate::remote::route_to_remote;

/// `nodeport_reply` (tail-called by `from_pod`): a local backend's packet
/// that is a reply of a translated flow goes back to the client. None: not
/// one.
#[inline(always)]
pub(crate) fn reply_from_pod(ctx: &TcContext) -> Option<i32> {
    let s = scratch()?;
    parse(ctx, s)?;
    if s.icmp != 0 {
        let flow = NAT_REVERSE.get_ptr(&s.key)?;
        return Some(icmp_error_out(ctx, s, flow));
    }
    let reply = NAT_REVERSE.get_ptr_mut(&s.key)?;
    keep_fragment_ports(s);
    Some(reply_out(ctx, s, reply))
}

/// A reply translated back (from the frontend, to the client) and sent out
/// of the uplink its flow came in by.
#[inline(never)]
pub(crate) fn reply_out(ctx: &TcContext, s: &mut Scratch, known: *mut NatReverse) -> i32 {
    // SAFETY: a valid map value for the program's run; read once.
    s.reverse = unsafe { core::ptr::read_volatile(known) };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let closes = s.closing & !s.reverse.flags != 0;
    if now.wrapping_sub(s.reverse.last_ns) > REFRESH_NS || closes {
        s.reverse.flags |= s.closing;
        // SAFETY: as above; racing writers only write a time or a flag.
        unsafe {
            core::ptr::write_volatile(&mut (*known).last_ns, now);
            core::ptr::write_volatile(&mut (*known).flags, s.reverse.flags);
        }
    }
    if rewrite(ctx, s, Toward::Client).is_none() {
        return TC_ACT_SHOT as i32;
    }
    back_to_client(ctx, s)
}

/// An ICMP error about a translated flow's packet to its backend goes to
/// the flow's client as conntrack's NAT would send it
/// (`icmp::toward_client`).
#[inline(never)]
pub(crate) fn icmp_error_out(ctx: &TcContext, s: &mut Scratch, flow: *const NatReverse) -> i32 {
    // SAFETY: a valid map value for the program's run; read once.
    s.reverse = unsafe { core::ptr::read_volatile(flow) };
    icmp::toward_client(s);
    if icmp::rewrite_error(ctx, s).is_none() {
        count(action::NODEPORT_DROPPED, ctx.len());
        return TC_ACT_SHOT as i32;
    }
    back_to_client(ctx, s)
}

/// A translated reply out of the uplink its flow came in by, or, to a pod
/// of a node reached through the VXLAN tunnel (the client of an
/// `externalTrafficPolicy: Local` flow), `TO_TUNNEL`: the FIB's way there
/// is the tunnel device, which sends nothing without a tunnel key.
#[inline(never)]
fn back_to_client(ctx: &TcContext, s: &Scratch) -> i32 {
    let len = ctx.len();
    // Only a client that kept its address can be a tunnelled node's pod:
    // the others' replies pay no tunnel lookup.
    if s.reverse.flags & NAT_F_CLIENT_KEPT != 0 && crate::tunnel::carries(ctx) {
        count(action::NODEPORT_REPLIED, len);
        return TO_TUNNEL;
    }
    match route_to_remote(ctx, s.reverse.ifindex, BPF_FIB_LOOKUP_OUTPUT as u32) {
        Some(verdict) => {
            // SAFETY: the context pointer is valid; `mark` is writable in tc.
            unsafe { (*ctx.skb.skb).mark = FAST_PATH_MARK };
            count(action::NODEPORT_REPLIED, len);
            verdict
        }
        None => {
            count(action::NODEPORT_DROPPED, len);
            TC_ACT_SHOT as i32
        }
    }
}

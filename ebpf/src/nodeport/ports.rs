//! A flow's node port and its way back: the reply tuple of a known flow,
//! its source, and a free node port for a new one (or one a spent flow
//! held, taken under a claim).

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::generated::bpf_get_prandom_u32;
use flatnet_common::{
    NAT_F_CLOSING, NAT_F_LOCAL_SOURCE, NAT_F_RESET, NAT_PORT_MAX, NAT_PORT_MIN, NatKey, NatReverse,
};

use crate::maps::nodeport::{NAT_CLAIMS, NAT_FORWARD, NAT_LOCAL_SOURCES, NAT_REVERSE, Scratch};
use crate::proto::IPPROTO_TCP;

/// Free node ports tried for a new flow before it is dropped.
const NAT_PORT_TRIES: u32 = 16;
/// A node port held by a TCP flow closed by a FIN, idle this long (one
/// reset, at once), may be given to a new flow: the agent collects such flows only
/// at its resync, and a node port is scarce (4,536 per node address,
/// backend and protocol).
const TCP_CLOSED_REUSE_NS: u64 = 1_000_000_000;
/// The same for a UDP flow idle this long (the kernel's
/// `nf_conntrack_udp_timeout`; the agent forgets it after 120 s).
const UDP_REUSE_NS: u64 = 30_000_000_000;

/// `s.reply`: the replies' tuple of the flow in `s.forward` (its client's
/// tuple in `s.key`, its source in `s.nat_source`).
#[inline(always)]
pub(crate) fn set_reply_of_forward(s: &mut Scratch) {
    let translated = s.forward.nat_port != [0; 2];
    s.reply = NatKey {
        src: s.forward.backend,
        dst: if translated { s.nat_source } else { s.key.src },
        src_port: s.forward.backend_port,
        dst_port: if translated {
            s.forward.nat_port
        } else {
            s.key.src_port
        },
        protocol: s.key.protocol,
        family: s.key.family,
        _pad: [0; 2],
    };
}

/// `s.nat_source` for the flow in `s.forward` (client's tuple in `s.key`):
/// the frontend's address, or the local one its first packet was given.
#[inline(always)]
pub(crate) fn load_nat_source(s: &mut Scratch) {
    s.nat_source = s.key.dst;
    if s.forward.flags & NAT_F_LOCAL_SOURCE != 0
        && let Some(kept) = NAT_LOCAL_SOURCES.get(u32::from(s.key.family != 4))
    {
        s.nat_source = *kept;
    }
}

/// Writes `s.reverse` under `s.reply` with a node port nobody has for the
/// same backend and node address, or one a spent flow holds (closed, or
/// idle: `take_spent`), which is forgotten both ways; the port, or None
/// when the tries ran out.
#[inline(always)]
pub(crate) fn free_port(s: &mut Scratch) -> Option<[u8; 2]> {
    let span = u32::from(NAT_PORT_MAX - NAT_PORT_MIN) + 1;
    for _ in 0..NAT_PORT_TRIES {
        // SAFETY: plain helper call.
        let offset = unsafe { bpf_get_prandom_u32() } % span;
        let port = (u32::from(NAT_PORT_MIN) + offset) as u16;
        s.reply.dst_port = port.to_be_bytes();
        // Looked up first: a write that finds the port taken has already
        // taken a node off the LRU's free list and must give it back, two
        // trips through its locks for nothing.
        let taken = match NAT_REVERSE.get_ptr(&s.reply) {
            None => NAT_REVERSE
                .insert(&s.reply, &s.reverse, u64::from(BPF_NOEXIST))
                .is_ok(),
            Some(held) => spent_at_a_glance(s, held) && take_claimed(s),
        };
        if taken {
            return Some(s.reply.dst_port);
        }
    }
    None
}

/// Whether the flow holding `s.reply`'s node port (its reverse entry,
/// `held`, read into `s.spent`) looks spent by its own marks: a reset TCP
/// flow at once, one closed by a FIN once idle a while (it may still be
/// finishing its handshake), a UDP flow once its replies are idle.
#[inline(always)]
fn spent_at_a_glance(s: &mut Scratch, held: *const NatReverse) -> bool {
    // SAFETY: a valid map value for the program's run; read once.
    s.spent = unsafe { core::ptr::read_volatile(held) };
    // Saturating: another CPU may have stamped the flow just after this
    // one read the clock; wrapped, a live flow would look idle for ages.
    let idle = s.reverse.last_ns.saturating_sub(s.spent.last_ns);
    if s.reply.protocol == IPPROTO_TCP {
        s.spent.flags & NAT_F_RESET != 0
            || (s.spent.flags & NAT_F_CLOSING != 0 && idle > TCP_CLOSED_REUSE_NS)
    } else {
        idle > UDP_REUSE_NS
    }
}

/// Takes `s.reply`'s node port, which looked spent, under a claim
/// (`NAT_CLAIMS`, written only where none is): another CPU's new flow may
/// have found the same port at the same time, and two writes would give
/// both flows one port. The port's entry is read again under the claim
/// (the other flow may have it by now), and the claim given back.
#[inline(always)]
fn take_claimed(s: &mut Scratch) -> bool {
    if NAT_CLAIMS
        .insert(&s.reply, &0, u64::from(BPF_NOEXIST))
        .is_err()
    {
        return false;
    }
    let taken = match NAT_REVERSE.get_ptr(&s.reply) {
        None => NAT_REVERSE
            .insert(&s.reply, &s.reverse, u64::from(BPF_NOEXIST))
            .is_ok(),
        Some(held) => take_spent(s, held) && NAT_REVERSE.insert(&s.reply, &s.reverse, 0).is_ok(),
    };
    let _ = NAT_CLAIMS.remove(&s.reply);
    taken
}

/// Whether the flow holding `s.reply`'s node port (its reverse entry,
/// `held`) is spent; if so its forward entry is forgotten (its reverse one
/// is then overwritten).
#[inline(always)]
fn take_spent(s: &mut Scratch, held: *const NatReverse) -> bool {
    let tcp = s.reply.protocol == IPPROTO_TCP;
    if !spent_at_a_glance(s, held) {
        return false;
    }
    s.spent_key = NatKey {
        src: s.spent.client,
        dst: s.spent.frontend,
        src_port: s.spent.client_port,
        dst_port: s.spent.frontend_port,
        protocol: s.reply.protocol,
        family: s.reply.family,
        _pad: [0; 2],
    };
    // The client's tuple may have a flow of its own by now, on another
    // port (its old forward entry forgotten first, by the LRU): that one
    // is kept. A UDP flow's client may still be sending, though nothing
    // came back: as conntrack, its flow is idle only when neither way is
    // used.
    let Some(forward) = NAT_FORWARD.get_ptr(&s.spent_key) else {
        return true;
    };
    // SAFETY: a valid map value for the program's run; each field read once.
    let (port, backend, last_ns) = unsafe {
        (
            core::ptr::read_volatile(&(*forward).nat_port),
            core::ptr::read_volatile(&(*forward).backend),
            core::ptr::read_volatile(&(*forward).last_ns),
        )
    };
    if port != s.reply.dst_port || backend != s.reply.src {
        return true;
    }
    if !tcp && s.reverse.last_ns.saturating_sub(last_ns) <= UDP_REUSE_NS {
        return false;
    }
    let _ = NAT_FORWARD.remove(&s.spent_key);
    true
}

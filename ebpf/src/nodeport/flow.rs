//! A packet from outside and its flow: found (`from_outside`), refreshed,
//! reopened by a SYN, or started: its frontend, its backend (with
//! sessionAffinity) and, over IPv6 to a local backend, its source.

use aya_ebpf::bindings::{
    BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_SKIP_NEIGH, BPF_FIB_LOOKUP_SRC, TC_ACT_SHOT,
    bpf_fib_lookup,
};
use aya_ebpf::helpers::generated::{bpf_fib_lookup, bpf_ktime_get_coarse_ns};
use aya_ebpf::programs::TcContext;
use flatnet_common::{
    AffinityKey, BackendKey, FRONTEND_F_EXTERNAL, FRONTEND_F_KEEP_CLIENT, NAT_F_CLIENT_KEPT,
    NAT_F_CLOSING, NAT_F_LOCAL_SOURCE, NAT_PORT_MIN, NatForward, NatKey, NatReverse,
    NodePortAddress, ServiceKey, ServiceValue, action, external_port,
};

use crate::counters::count;
use crate::external_ports::listening_on;
use crate::maps::endpoints::ENDPOINTS_V6;
use crate::maps::nodeport::{FRAGMENT_LATER, NAT_FORWARD, NAT_LOCAL_SOURCES, NAT_REVERSE, Scratch};
use crate::maps::services::{NODEPORT_ADDRS, SERVICE_BACKENDS, SERVICES};
use crate::nodeport::REFRESH_NS;
use crate::nodeport::backend::{icmp_error_in, to_backend};
use crate::nodeport::parse::{keep_fragment_ports, parse, scratch};
use crate::nodeport::ports::{free_port, load_nat_source, set_reply_of_forward};
use crate::nodeport::reply::{icmp_error_out, reply_out};
use crate::packet::zero_words;
use crate::policy;
use crate::proto::AF_INET6;
use crate::remote::words;
use crate::services::affinity_index;

/// `nodeport_in` (tail-called by `from_uplink`): a packet from outside for
/// a frontend, or a reply of a flow translated here, is translated and
/// sent on. None: not the NodePort path's.
#[inline(always)]
pub(crate) fn from_outside(ctx: &TcContext, uplink: u32) -> Option<i32> {
    let s = scratch()?;
    parse(ctx, s)?;
    if s.icmp != 0 {
        // About a translated flow's packet to its client, or to its
        // backend, or the stack's.
        if let Some(flow) = NAT_REVERSE.get_ptr(&s.key) {
            return Some(icmp_error_out(ctx, s, flow));
        }
        let flow = NAT_FORWARD.get_ptr(&s.key)?;
        return Some(icmp_error_in(ctx, s, flow, uplink));
    }
    let port = u16::from_be_bytes(s.key.dst_port);
    if port >= NAT_PORT_MIN {
        if let Some(reply) = NAT_REVERSE.get_ptr_mut(&s.key) {
            keep_fragment_ports(s);
            return Some(reply_out(ctx, s, reply));
        }
    }
    let listening = listening_on(port);
    let protocol = s.key.protocol;
    if listening & (external_port::nodeport_bit(protocol) | external_port::address_bit(protocol))
        == 0
    {
        return None;
    }
    let known = NAT_FORWARD
        .get_ptr_mut(&s.key)
        .filter(|&known| s.opening == 0 || !reopens(s, known));
    match known {
        Some(known) => refresh_forward(s, known),
        // A later fragment starts no flow.
        None if s.fragment == FRAGMENT_LATER => return None,
        None => match new_flow(ctx, s, listening, uplink) {
            FlowStart::Started => {}
            FlowStart::NotOurs => return None,
            FlowStart::Dropped => {
                count(action::NODEPORT_DROPPED, ctx.len());
                return Some(TC_ACT_SHOT as i32);
            }
        },
    }
    keep_fragment_ports(s);
    Some(to_backend(ctx, s, uplink))
}

/// A known flow's translation into `s.forward`, its last use refreshed.
#[inline(never)]
fn refresh_forward(s: &mut Scratch, known: *mut NatForward) {
    // SAFETY: a valid map value for the program's run; read once.
    s.forward = unsafe { core::ptr::read_volatile(known) };
    load_nat_source(s);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let closes = s.closing & !s.forward.flags != 0;
    if now.wrapping_sub(s.forward.last_ns) > REFRESH_NS || closes {
        s.forward.last_ns = now;
        s.forward.flags |= s.closing;
        // SAFETY: as above; racing writers only write a time or a flag.
        unsafe {
            core::ptr::write_volatile(&mut (*known).last_ns, now);
            core::ptr::write_volatile(&mut (*known).flags, s.forward.flags);
        }
    }
    if closes {
        // The way back closes too: its node port may be reused once idle
        // (`take_spent` reads the reverse entry).
        set_reply_of_forward(s);
        if let Some(back) = NAT_REVERSE.get_ptr_mut(&s.reply) {
            // SAFETY: a valid map value for the program's run; racing
            // writers only write a time or a flag.
            unsafe {
                let flags = core::ptr::read_volatile(&(*back).flags);
                core::ptr::write_volatile(&mut (*back).flags, flags | s.closing);
                core::ptr::write_volatile(&mut (*back).last_ns, now);
            }
        }
    }
}

/// Whether a SYN (`s.opening`) of a known flow (`known`) opens a new
/// connection on its client's tuple: the old one was closed or reset (its
/// flags, either way), or its node port is no longer its own. Then the old
/// flow's forward entry is forgotten and the SYN starts a new flow, as
/// conntrack kills a closed connection's entry when a SYN reopens its tuple
/// and NATs the SYN afresh. Else it is a retransmitted SYN of the flow.
/// (Kept, the old flow's closing flags would mark the new connection's node
/// port spent, and another client's new flow could take it while it is
/// live.) The old reverse entry stays, spent, for a new flow to take: a
/// removal here could remove one another CPU has just written there.
#[inline(never)]
fn reopens(s: &mut Scratch, known: *mut NatForward) -> bool {
    // SAFETY: a valid map value for the program's run; read once.
    s.forward = unsafe { core::ptr::read_volatile(known) };
    load_nat_source(s);
    set_reply_of_forward(s);
    let mut over = s.forward.flags & NAT_F_CLOSING != 0;
    let mut owned = false;
    if let Some(back) = NAT_REVERSE.get_ptr(&s.reply) {
        // SAFETY: a valid map value for the program's run; read once.
        s.spent = unsafe { core::ptr::read_volatile(back) };
        owned = s.spent.client == s.key.src
            && s.spent.client_port == s.key.src_port
            && s.spent.frontend == s.key.dst
            && s.spent.frontend_port == s.key.dst_port;
        over |= s.spent.flags & NAT_F_CLOSING != 0;
    }
    if owned && !over {
        return false;
    }
    let _ = NAT_FORWARD.remove(&s.key);
    true
}

/// What became of a flow's first packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FlowStart {
    /// Given a backend: `s.forward` holds the translation, recorded both ways.
    Started,
    /// For no frontend outside clients reach (the stack's; a frontend
    /// without endpoints, too: nothing listens there, so the stack
    /// refuses it, as kube-proxy's REJECT).
    NotOurs,
    /// Dropped: `externalTrafficPolicy: Local` without a backend here, or
    /// no free node port.
    Dropped,
}

/// The frontend a new flow's first packet is for and the backend it
/// gets; its translation recorded both ways.
#[inline(never)]
fn new_flow(ctx: &TcContext, s: &mut Scratch, listening: u32, uplink: u32) -> FlowStart {
    let flow = &s.key;
    let mut key = ServiceKey {
        address: flow.dst,
        port: flow.dst_port,
        protocol: flow.protocol,
        family: flow.family,
    };
    let Some(frontend) = frontend_for(&mut key, listening) else {
        return FlowStart::NotOurs;
    };
    if frontend.flags & FRONTEND_F_EXTERNAL == 0 || frontend.count == 0 {
        return FlowStart::NotOurs;
    }
    let choices = u32::from(frontend.external_count).min(frontend.count);
    if choices == 0 {
        return FlowStart::Dropped;
    }
    let index = affinity_index(client_of(&flow.src, &key), &frontend, choices);
    let backend_key = BackendKey {
        id: frontend.id,
        index,
    };
    // SAFETY: the value is copied at once.
    let Some(backend) = (unsafe { SERVICE_BACKENDS.get(&backend_key) }) else {
        return FlowStart::NotOurs;
    };
    s.backend = *backend;
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    s.reverse = NatReverse {
        client: flow.src,
        frontend: flow.dst,
        client_port: flow.src_port,
        frontend_port: flow.dst_port,
        ifindex: uplink,
        flags: 0,
        _pad: 0,
        last_ns: now,
    };
    // The reply's tuple: from the backend to the client, or, translated,
    // to the node address on the port found free for it.
    s.reply = NatKey {
        src: s.backend.address,
        dst: flow.src,
        src_port: s.backend.port,
        dst_port: flow.src_port,
        protocol: flow.protocol,
        family: flow.family,
        _pad: [0; 2],
    };
    let mut flags = 0;
    let nat_port = if frontend.flags & FRONTEND_F_KEEP_CLIENT != 0 {
        s.reverse.flags = NAT_F_CLIENT_KEPT;
        // A failed write only leaves the replies untranslated.
        let _ = NAT_REVERSE.insert(&s.reply, &s.reverse, 0);
        // The replies go to the client's own address, maybe a pod of
        // another node, which `from_pod` would route as they are: their
        // flow's kept verdict sends them to `nodeport_reply` instead.
        crate::flow::keep_nodeport_reply(&s.reply);
        [0; 2]
    } else {
        s.reply.dst = s.key.dst;
        if local_masquerade_source(ctx, s, uplink) {
            s.reply.dst = s.nat_source;
            flags = NAT_F_LOCAL_SOURCE;
        }
        match free_port(s) {
            Some(port) => port,
            None => return FlowStart::Dropped,
        }
    };
    s.nat_source = s.reply.dst;
    s.forward = NatForward {
        backend: s.backend.address,
        backend_port: s.backend.port,
        nat_port,
        flags,
        last_ns: now,
    };
    if NAT_FORWARD.insert(&s.key, &s.forward, 0).is_err() {
        let _ = NAT_REVERSE.remove(&s.reply);
        return FlowStart::Dropped;
    }
    FlowStart::Started
}

/// The frontend at the packet's destination: an external address's own
/// entry, or on one of this node's NodePort addresses the NodePort (`key`
/// then holds the wildcard, as affinity keys it).
#[inline(always)]
fn frontend_for(key: &mut ServiceKey, listening: u32) -> Option<ServiceValue> {
    if listening & external_port::address_bit(key.protocol) != 0 {
        // SAFETY: the value is copied at once.
        if let Some(frontend) = unsafe { SERVICES.get(&*key) } {
            return Some(*frontend);
        }
    }
    if listening & external_port::nodeport_bit(key.protocol) == 0 {
        return None;
    }
    let node = NodePortAddress {
        address: key.address,
        family: key.family,
        _pad: [0; 3],
    };
    // SAFETY: only the presence is read.
    unsafe { NODEPORT_ADDRS.get(&node) }?;
    if !policy::is_node_address(&key.address, key.family) {
        return None;
    }
    key.address = [0; 16];
    // SAFETY: the value is copied at once.
    unsafe { SERVICES.get(&*key) }.copied()
}

/// sessionAffinity's key of an outside client: its address, in a space of
/// its own (the top bit set; socket clients are network namespace cookies,
/// which count up from 1). IPv6 addresses are folded into 63 bits.
#[inline(always)]
fn client_of(address: &[u8; 16], frontend: &ServiceKey) -> AffinityKey {
    let mut high = [0u8; 8];
    let mut low = [0u8; 8];
    high.copy_from_slice(&address[..8]);
    low.copy_from_slice(&address[8..]);
    AffinityKey {
        netns_cookie: (u64::from_ne_bytes(high) ^ u64::from_ne_bytes(low)) | (1 << 63),
        frontend: *frontend,
        _pad: 0,
    }
}

/// Whether MASQUERADE would give a flow to `s.backend` another source
/// than its frontend's address (in `s.key.dst`): over IPv6, for a backend
/// on this node, the address the kernel selects toward the pod
/// (`ipv6_dev_get_saddr`, which MASQUERADE and `BPF_FIB_LOOKUP_SRC` both
/// ask, the route as forwarded from `uplink`): the pod network's gateway
/// address, the longest match with the pod's. It is then in
/// `s.nat_source`, and kept in `NAT_LOCAL_SOURCES` for the flow's later
/// packets. Over IPv4 MASQUERADE takes the first global address of the
/// node's devices (`inet_select_addr`, the host veth having none: the
/// node's address), not the route's preferred source the FIB would give
/// (the gateway's); and a backend on another node is reached by the
/// uplink, whose address it picks: the frontend's address stays.
#[inline(never)]
fn local_masquerade_source(ctx: &TcContext, s: &mut Scratch, uplink: u32) -> bool {
    // SAFETY: only whether an entry is there is read.
    if s.key.family == 4 || unsafe { ENDPOINTS_V6.get(s.backend.address) }.is_none() {
        return false;
    }
    // All-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    zero_words(&raw mut s.fib);
    s.fib.ifindex = uplink;
    s.fib.l4_protocol = s.key.protocol;
    s.fib.family = AF_INET6;
    s.fib.__bindgen_anon_3.ipv6_src = words(s.key.src);
    s.fib.__bindgen_anon_4.ipv6_dst = words(s.backend.address);
    // SAFETY: the skb pointer and a params struct of the size given.
    let found = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            &mut s.fib,
            size_of::<bpf_fib_lookup>() as i32,
            BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH,
        )
    };
    if found != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return false;
    }
    // SAFETY: the IPv6 member the lookup filled in; four words are 16 bytes.
    s.nat_source =
        unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(s.fib.__bindgen_anon_3.ipv6_src) };
    if s.nat_source == s.key.dst || s.nat_source == [0; 16] {
        return false;
    }
    if let Some(kept) = NAT_LOCAL_SOURCES.get_ptr_mut(1) {
        // SAFETY: a valid map value for the program's run; racing writers
        // write the same answer.
        unsafe { core::ptr::write_volatile(kept, s.nat_source) };
    }
    true
}

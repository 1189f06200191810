//! Kubernetes NetworkPolicy, enforced where packets leave and enter pods.
//!
//! Each pod has an entry in `POLICY_PODS`, by its counter slot: which of its
//! directions a policy isolates, and the generation of its policy. A pod no
//! policy selects (flags 0) costs that one array read per packet and
//! nothing else. For an isolated direction, the pod's allowed peers are in
//! the LPM tries `POLICY_V4`/`POLICY_V6`, keyed by (slot, direction, peer
//! address): the longest prefix holding the peer says which protocols and
//! destination ports are allowed (`PolicyPorts`); no entry means denied.
//!
//! Judged once per flow: a packet the tables allow is recorded in
//! `POLICY_FLOWS` (an LRU hash) under (slot, direction, its 5-tuple), and
//! so is its reverse under the other direction (marked as a reply), so the
//! flow's later packets and its replies pass with one hash lookup and no
//! trie walk. A pod selected for one direction only records flows in both
//! (the replies to its own connections must get in once it becomes isolated
//! the other way, and vice versa).
//!
//! Policy changes and established flows: every recorded flow carries the
//! pod's policy generation when it was allowed; the library bumps the
//! generation with every change, and a flow of an older generation is
//! judged again, against the new tables, by the packet that began it (a
//! reply entry is judged as its flow's first packet: the other direction,
//! the far side's address, the port the flow was opened to). So an
//! established connection the new policy no longer allows is cut at its
//! next packet, one it still allows goes on untouched; this costs a
//! compare of two integers per packet. A flow the LRU forgot (idle while
//! 65536 newer ones came) is judged anew by its next packet like a new one:
//! a reply then needs the pod's tables to allow it as a packet of its own.
//!
//! What is judged: TCP, UDP and SCTP by protocol and destination port;
//! every other protocol only by an entry allowing everything (`any`). An
//! ICMP or ICMPv6 error passes as part of the flow it quotes when that flow
//! is recorded for the pod and direction under its current policy (the
//! quoted packet's reverse looked up in `POLICY_FLOWS`), else it is judged
//! as ICMP. Neighbour discovery and MLD are never judged (nor ARP, which
//! never gets here). IPv4 fragments after the first, packets with IPv4 options and
//! IPv6 extension headers (other than BIG TCP's jumbo Hop-by-Hop) are
//! judged without ports: only an `any` entry lets them through.

use aya_ebpf::btf_maps::{LruHashMap, RingBuf};
use aya_ebpf::helpers::generated::bpf_ktime_get_ns;
use flatnet_common::{
    LocalAddrKey, POLICY_DIR_EGRESS, POLICY_DIR_INGRESS, POLICY_DIR_PAIR, POLICY_F_EGRESS,
    POLICY_F_INGRESS, POLICY_FLOW_F_REPLY, POLICY_KEY_FIXED_BITS, POLICY_MAX_RANGES,
    POLICY_REASON_EXCEPT, POLICY_REASON_NO_PREFIX, POLICY_REASON_PORT, PolicyCidrV4, PolicyCidrV6,
    PolicyDrops, PolicyEvent, PolicyFlow, PolicyFlowKey, PolicyPod, PolicyPorts,
};

use crate::flow::{IPPROTO_ICMP, IPPROTO_ICMPV6, ipv6_transport, is_icmp_error};
use crate::*;

/// Each pod's isolation and policy generation, by counter slot.
#[btf_map]
static POLICY_PODS: Array<PolicyPod, { maps::POLICY_PODS.max_entries as usize }> = Array::new();
const _: () = assert!(maps::POLICY_PODS.holds::<u32, PolicyPod>());

/// (slot, direction, IPv4 peer prefix) -> what it allows.
#[btf_map]
static POLICY_V4: LpmTrie<PolicyCidrV4, PolicyPorts, { maps::POLICY_V4.max_entries as usize }> =
    LpmTrie::new();
const _: () = assert!(maps::POLICY_V4.holds::<Key<PolicyCidrV4>, PolicyPorts>());

/// (slot, direction, IPv6 peer prefix) -> what it allows.
#[btf_map]
static POLICY_V6: LpmTrie<PolicyCidrV6, PolicyPorts, { maps::POLICY_V6.max_entries as usize }> =
    LpmTrie::new();
const _: () = assert!(maps::POLICY_V6.holds::<Key<PolicyCidrV6>, PolicyPorts>());

/// Flows policy allowed, per pod and direction (see above).
#[btf_map]
static POLICY_FLOWS: LruHashMap<
    PolicyFlowKey,
    PolicyFlow,
    { maps::POLICY_FLOWS.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::POLICY_FLOWS.holds::<PolicyFlowKey, PolicyFlow>());

/// What policy dropped, per pod and direction.
#[btf_map]
static POLICY_DROPS: PerCpuArray<PolicyDrops, { maps::POLICY_DROPS.max_entries as usize }> =
    PerCpuArray::new();
const _: () = assert!(maps::POLICY_DROPS.holds::<u32, PolicyDrops>());

/// One event per packet policy dropped, for `flatnet monitor`. Written with
/// `bpf_ringbuf_output`, which never blocks: when the buffer is full (no
/// reader, or a slow one) the event is lost and counted in `STATS`
/// (`POLICY_EVENTS_LOST`).
#[btf_map]
static POLICY_EVENTS: RingBuf<PolicyEvent, { maps::POLICY_EVENTS.max_entries as usize }> =
    RingBuf::new();
const _: () = assert!(maps::POLICY_EVENTS.holds::<(), ()>());

/// The node's own addresses: traffic from them into a pod (kubelet's
/// probes) is always allowed.
#[btf_map]
static LOCAL_ADDRS: HashMap<LocalAddrKey, u32, { maps::LOCAL_ADDRS.max_entries as usize }> =
    HashMap::new();
const _: () = assert!(maps::LOCAL_ADDRS.holds::<LocalAddrKey, u32>());

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;

/// More-fragments flag and fragment offset; the offset alone.
const IPV4_OFFSET_MASK: u16 = 0x1fff;

/// A pod's policy state, as read once per packet.
#[derive(Clone, Copy)]
pub(crate) struct PodPolicy {
    pub(crate) slot: u32,
    pub(crate) flags: u32,
    pub(crate) generation: u32,
}

impl PodPolicy {
    /// Selected by some policy (in either direction).
    #[inline(always)]
    pub(crate) fn selected(&self) -> bool {
        self.flags != 0
    }
}

/// The policy of the pod in counter slot `slot`: the one lookup a pod that
/// no policy selects pays.
#[inline(always)]
pub(crate) fn of_slot(slot: u32) -> PodPolicy {
    let mut pod = PodPolicy {
        slot,
        flags: 0,
        generation: 0,
    };
    if slot == NO_COUNTER_SLOT {
        return pod;
    }
    if let Some(entry) = POLICY_PODS.get_ptr(slot) {
        // SAFETY: a valid map value for the program's run; read once.
        let entry = unsafe { core::ptr::read_volatile(entry) };
        pod.flags = entry.flags;
        pod.generation = entry.generation;
    }
    pod
}

/// Source and destination ports, the first 4 bytes of TCP, UDP and SCTP.
#[repr(C)]
struct Ports {
    src: [u8; 2],
    dst: [u8; 2],
}

/// The start of an ICMP or ICMPv6 header.
#[repr(C)]
struct IcmpHeader {
    icmp_type: u8,
    code: u8,
}

/// What a packet is, as policy sees it: its flow key (slot and direction
/// filled in by the judge), and whether it is an ICMP error quoting a
/// packet of `quoted` (a key of that packet).
struct Judged {
    key: PolicyFlowKey,
    /// Neighbour discovery or MLD: never judged.
    exempt: bool,
    /// An ICMP or ICMPv6 error: where the IP header it quotes starts (else
    /// 0). An error of a recorded flow passes as part of it; the flow's
    /// key is read from the quote only then (kept off the stack the rest of
    /// the time: the programs are at the verifier's stack limit).
    quote: usize,
}

/// ICMP's header before the quoted packet of an error: type, code,
/// checksum and 4 bytes (unused, or the next-hop MTU).
const ICMP_ERROR_HEADER: usize = 8;

/// The key of the flow an ICMP(v6) error whose quoted IP header is at
/// `offset` belongs to (slot and direction left to the judge): the quoted
/// packet's reverse. None when the quote is cut short; its ports are left
/// zero when they are not in the packet.
#[inline(always)]
fn quoted_v4(start: usize, end: usize, offset: usize) -> Option<PolicyFlowKey> {
    let inner = header_at::<Ipv4Hdr>(start, end, offset).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let inner = unsafe { &*inner };
    let mut key = PolicyFlowKey {
        src: in_16_bytes(inner.dst_addr),
        dst: in_16_bytes(inner.src_addr),
        protocol: inner.proto,
        family: 4,
        ..PolicyFlowKey::default()
    };
    if inner.ihl() == Ipv4Hdr::LEN as u8 {
        ports_at(start, end, offset + Ipv4Hdr::LEN, inner.proto, &mut key);
        core::mem::swap(&mut key.sport, &mut key.dport);
    }
    Some(key)
}

#[inline(always)]
fn quoted_v6(start: usize, end: usize, offset: usize) -> Option<PolicyFlowKey> {
    let inner = header_at::<Ipv6Hdr>(start, end, offset).ok()?;
    // SAFETY: bounds checked by `header_at`.
    let inner = unsafe { &*inner };
    let mut key = PolicyFlowKey {
        src: inner.dst_addr,
        dst: inner.src_addr,
        protocol: inner.next_hdr,
        family: 6,
        ..PolicyFlowKey::default()
    };
    // Ports only right after the fixed header (no extension headers).
    ports_at(start, end, offset + Ipv6Hdr::LEN, inner.next_hdr, &mut key);
    core::mem::swap(&mut key.sport, &mut key.dport);
    Some(key)
}

/// Whether `protocol` has the ports policy judges.
#[inline(always)]
fn has_ports(protocol: u8) -> bool {
    matches!(protocol, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP)
}

/// The ports of a `protocol` header at `offset`, when it has them and they
/// are in the packet (else zero).
#[inline(always)]
fn ports_at(start: usize, end: usize, offset: usize, protocol: u8, key: &mut PolicyFlowKey) {
    if !has_ports(protocol) {
        return;
    }
    if let Ok(ports) = header_at::<Ports>(start, end, offset) {
        // SAFETY: bounds checked by `header_at`.
        unsafe {
            key.sport = (*ports).src;
            key.dport = (*ports).dst;
        }
    }
}

/// An IPv4 address in the first 4 of 16 bytes (as `PolicyFlowKey` holds it).
#[inline(always)]
fn in_16_bytes(address: [u8; 4]) -> [u8; 16] {
    u128::from(u32::from_le_bytes(address)).to_le_bytes()
}

/// The IPv4 packet at `EthHdr::LEN`, for policy.
#[inline(always)]
fn judged_v4(start: usize, end: usize, ip: &Ipv4Hdr) -> Judged {
    let mut judged = Judged {
        key: PolicyFlowKey {
            src: in_16_bytes(ip.src_addr),
            dst: in_16_bytes(ip.dst_addr),
            protocol: ip.proto,
            family: 4,
            ..PolicyFlowKey::default()
        },
        exempt: false,
        quote: 0,
    };
    // With options or past the first fragment, the ports are not read:
    // only an `any` entry allows such a packet.
    if ip.ihl() != Ipv4Hdr::LEN as u8 || u16::from_be_bytes(ip.frags) & IPV4_OFFSET_MASK != 0 {
        return judged;
    }
    let l4 = EthHdr::LEN + Ipv4Hdr::LEN;
    ports_at(start, end, l4, ip.proto, &mut judged.key);
    if ip.proto == IPPROTO_ICMP
        && let Ok(icmp) = header_at::<IcmpHeader>(start, end, l4)
        // SAFETY: bounds checked by `header_at`.
        && is_icmp_error(unsafe { (*icmp).icmp_type })
    {
        judged.quote = l4 + ICMP_ERROR_HEADER;
    }
    judged
}

/// The IPv6 packet at `EthHdr::LEN`, for policy.
#[inline(always)]
fn judged_v6(start: usize, end: usize, ip: &Ipv6Hdr) -> Judged {
    let mut judged = Judged {
        key: PolicyFlowKey {
            src: ip.src_addr,
            dst: ip.dst_addr,
            protocol: ip.next_hdr,
            family: 6,
            ..PolicyFlowKey::default()
        },
        // Link-scope traffic (to fe80::/10, or to interface- and
        // link-local multicast, like MLD reports behind their Hop-by-Hop
        // router alert to ff02::16) never leaves the pod's link: the host's
        // to answer, not policy's to judge.
        exempt: crate::pod::is_link_local(&ip.dst_addr)
            || (crate::pod::is_multicast(&ip.dst_addr) && ip.dst_addr[1] & 0x0f <= 2),
        quote: 0,
    };
    let Some((protocol, l4)) = ipv6_transport(start, end, ip) else {
        return judged;
    };
    judged.key.protocol = protocol;
    ports_at(start, end, l4, protocol, &mut judged.key);
    if protocol == IPPROTO_ICMPV6
        && let Ok(icmp) = header_at::<IcmpHeader>(start, end, l4)
    {
        // SAFETY: bounds checked by `header_at`.
        let icmp_type = unsafe { (*icmp).icmp_type };
        // MLD (130-132, 143) and neighbour discovery (133-137).
        judged.exempt |= matches!(icmp_type, 130..=137 | 143);
        // Errors: destination unreachable, packet too big, time exceeded,
        // parameter problem.
        if icmp_type < 128 {
            judged.quote = l4 + ICMP_ERROR_HEADER;
        }
    }
    judged
}

/// The `POLICY_F_*` bit of `direction`.
#[inline(always)]
fn isolates(pod: PodPolicy, direction: u32) -> bool {
    let bit = if direction == POLICY_DIR_INGRESS {
        POLICY_F_INGRESS
    } else {
        POLICY_F_EGRESS
    };
    pod.flags & bit != 0
}

/// The other direction.
#[inline(always)]
fn other(direction: u32) -> u32 {
    if direction == POLICY_DIR_INGRESS {
        POLICY_DIR_EGRESS
    } else {
        POLICY_DIR_INGRESS
    }
}

/// Allowed (else one of `POLICY_REASON_*`).
const ALLOWED: u8 = 0;

/// Whether the entry `set` allows `protocol` to `port` (host order):
/// `ALLOWED`, or why not.
#[inline(always)]
fn set_verdict(set: *const PolicyPorts, protocol: u8, port: u16) -> u8 {
    // SAFETY: a valid map value for the program's run; fields read once.
    let (any, count) = unsafe {
        (
            core::ptr::read_volatile(&(*set).any),
            core::ptr::read_volatile(&(*set).count),
        )
    };
    if any != 0 {
        return ALLOWED;
    }
    if count == 0 {
        return POLICY_REASON_EXCEPT;
    }
    if !has_ports(protocol) {
        return POLICY_REASON_PORT;
    }
    for i in 0..POLICY_MAX_RANGES {
        if i >= count as usize {
            break;
        }
        // SAFETY: an element of the value's array, read once.
        let range = unsafe { core::ptr::read_volatile(&(*set).ranges[i]) };
        if range.protocol == protocol && range.first <= port && port <= range.last {
            return ALLOWED;
        }
    }
    POLICY_REASON_PORT
}

/// Whether the pod's `direction` table allows `protocol` to `port` with
/// `peer` on the far side (IPv4 in the first 4 bytes when `family` is 4):
/// `ALLOWED`, or why not.
#[inline(always)]
fn table_verdict(
    pod: PodPolicy,
    direction: u32,
    family: u8,
    peer: &[u8; 16],
    protocol: u8,
    port: u16,
) -> u8 {
    let found = if family == 4 {
        let key = Key::new(
            POLICY_KEY_FIXED_BITS + 32,
            PolicyCidrV4 {
                slot: pod.slot,
                direction,
                address: [peer[0], peer[1], peer[2], peer[3]],
            },
        );
        POLICY_V4.get(&key).map(|set| set as *const PolicyPorts)
    } else {
        let key = Key::new(
            POLICY_KEY_FIXED_BITS + 128,
            PolicyCidrV6 {
                slot: pod.slot,
                direction,
                address: *peer,
            },
        );
        POLICY_V6.get(&key).map(|set| set as *const PolicyPorts)
    };
    match found {
        Some(set) => set_verdict(set, protocol, port),
        None => POLICY_REASON_NO_PREFIX,
    }
}

/// The key of the replies to the packet of `key`, for the other direction.
#[inline(always)]
fn reversed(key: &PolicyFlowKey) -> PolicyFlowKey {
    PolicyFlowKey {
        src: key.dst,
        dst: key.src,
        sport: key.dport,
        dport: key.sport,
        protocol: key.protocol,
        family: key.family,
        direction: other(u32::from(key.direction)) as u8,
        _pad: 0,
        slot: key.slot,
        receiver_slot: 0,
    }
}

/// Whether the ICMP error `judged` (at `start`) belongs to a flow recorded
/// for `pod`'s `direction` under its current policy (a reply of its own, a
/// PMTU "too big"): then it passes as part of that flow.
#[inline(always)]
fn error_of_recorded_flow(
    pod: PodPolicy,
    direction: u32,
    start: usize,
    end: usize,
    judged: &Judged,
) -> bool {
    let related = if judged.key.family == 4 {
        quoted_v4(start, end, judged.quote)
    } else {
        quoted_v6(start, end, judged.quote)
    };
    let Some(mut related) = related else {
        return false;
    };
    related.slot = pod.slot;
    related.direction = direction as u8;
    match POLICY_FLOWS.get_ptr(&related) {
        // SAFETY: a valid map value for the program's run; one field read.
        Some(known) => {
            let generation = unsafe { core::ptr::read_volatile(&(*known).generation) };
            generation == pod.generation
        }
        None => false,
    }
}

/// Whether policy lets the packet `judged` through `pod`'s `direction`
/// (`POLICY_DIR_*`); `trusted`: from one of the node's own addresses, always
/// allowed (but recorded, so the pod's replies get out). A pod no policy
/// selects is never judged. Denied packets are counted for the pod.
#[inline(always)]
fn allows(
    pod: PodPolicy,
    direction: u32,
    (start, end, judged): (usize, usize, &mut Judged),
    trusted: bool,
    len: u32,
) -> bool {
    if !pod.selected() || judged.exempt {
        return true;
    }
    if judged.quote != 0 && error_of_recorded_flow(pod, direction, start, end, judged) {
        return true;
    }
    let key = &mut judged.key;
    key.slot = pod.slot;
    key.direction = direction as u8;
    let mut reply = false;
    if let Some(known) = POLICY_FLOWS.get_ptr(&*key) {
        // SAFETY: a valid map value for the program's run; read once.
        let known = unsafe { core::ptr::read_volatile(known) };
        if known.generation == pod.generation {
            return true;
        }
        // Recorded under an older policy: judged again, as the packet
        // that began the flow.
        reply = known.flags & POLICY_FLOW_F_REPLY != 0;
    }
    // The far side: the source of what comes in, the destination of what
    // goes out (of a reply's flow too: its first packet had the same peer).
    let peer = if direction == POLICY_DIR_INGRESS {
        key.src
    } else {
        key.dst
    };
    let (judged_direction, port) = if reply {
        (other(direction), u16::from_be_bytes(key.sport))
    } else {
        (direction, u16::from_be_bytes(key.dport))
    };
    let verdict = if trusted || !isolates(pod, judged_direction) {
        ALLOWED
    } else {
        table_verdict(pod, judged_direction, key.family, &peer, key.protocol, port)
    };
    if verdict != ALLOWED {
        count_drop(pod.slot, direction, len);
        report_drop(key, verdict, len);
        return false;
    }
    let flags = if reply { POLICY_FLOW_F_REPLY } else { 0 };
    let value = PolicyFlow {
        generation: pod.generation,
        flags,
    };
    // A full LRU evicts its least recently used entry; a failed write only
    // means the next packet is judged again.
    let _ = POLICY_FLOWS.insert(&*key, &value, 0);
    let back = reversed(key);
    let value = PolicyFlow {
        generation: pod.generation,
        flags: flags ^ POLICY_FLOW_F_REPLY,
    };
    let _ = POLICY_FLOWS.insert(&back, &value, 0);
    true
}

/// An event for the packet of `key` (slot and direction filled in) that
/// policy dropped for `reason`; counted as lost when the buffer is full.
#[inline(always)]
fn report_drop(key: &PolicyFlowKey, reason: u8, len: u32) {
    let event = PolicyEvent {
        // SAFETY: plain helper call.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        src: key.src,
        dst: key.dst,
        sport: key.sport,
        dport: key.dport,
        protocol: key.protocol,
        family: key.family,
        direction: key.direction,
        reason,
        slot: key.slot,
        len,
    };
    if POLICY_EVENTS.output(&event, 0).is_err() {
        crate::count(flatnet_common::action::POLICY_EVENTS_LOST, len);
    }
}

#[inline(always)]
fn count_drop(slot: u32, direction: u32, len: u32) {
    if let Some(drops) = POLICY_DROPS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            if direction == POLICY_DIR_INGRESS {
                (*drops).ingress_packets += 1;
                (*drops).ingress_bytes += u64::from(len);
            } else {
                (*drops).egress_packets += 1;
                (*drops).egress_bytes += u64::from(len);
            }
        }
    }
}

/// The IP frame at `start` as policy sees it; None for frames that are not
/// IPv4 or IPv6, or whose IP header is cut short: not policy's to judge.
#[inline(always)]
fn judged_frame(start: usize, end: usize) -> Option<Judged> {
    let eth = header_at::<EthHdr>(start, end, 0).ok()?;
    // SAFETY: `header_at` checked the header lies inside the packet.
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let ip = header_at::<Ipv4Hdr>(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            Some(judged_v4(start, end, unsafe { &*ip }))
        }
        ETH_P_IPV6 => {
            let ip = header_at::<Ipv6Hdr>(start, end, EthHdr::LEN).ok()?;
            // SAFETY: bounds checked by `header_at`.
            Some(judged_v6(start, end, unsafe { &*ip }))
        }
        _ => None,
    }
}

/// Whether policy lets the IP frame at `start` through `pod`'s `direction`
/// (`trust_local`: a source among the node's own addresses is allowed).
#[inline(always)]
pub(crate) fn frame_allowed(
    start: usize,
    end: usize,
    pod: PodPolicy,
    direction: u32,
    trust_local: bool,
    len: u32,
) -> bool {
    if !pod.selected() {
        return true;
    }
    let Some(mut judged) = judged_frame(start, end) else {
        return true;
    };
    let trusted = trust_local && is_local(&judged.key);
    allows(pod, direction, (start, end, &mut judged), trusted, len)
}

/// Whether the packet's source is one of the node's own addresses.
#[inline(always)]
fn is_local(key: &PolicyFlowKey) -> bool {
    let address: LocalAddrKey = if key.family == 4 {
        let s = &key.src;
        [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, s[0], s[1], s[2], s[3],
        ]
    } else {
        key.src
    };
    // SAFETY: only whether there is an entry is read.
    unsafe { LOCAL_ADDRS.get(address) }.is_some()
}

/// What the sending pod's egress policy says of its frame, and, when the
/// datapath hands it to the local pod in counter slot `receiver` (else
/// `NO_COUNTER_SLOT`), that pod's ingress policy: the frame parsed once for
/// both. When both pods are selected, a pair record (`POLICY_DIR_PAIR`)
/// holding both generations answers for the two judgements with one lookup;
/// it is written once both allowed the packet, and is worth nothing after
/// either pod's policy changes (its generations no longer match), when the
/// two judgements are made again as for a new packet.
#[inline(always)]
pub(crate) fn sent_frame_allowed(start: usize, end: usize, sender: &Sender, receiver: u32) -> bool {
    let receiver = of_slot(receiver);
    if !sender.policy.selected() && !receiver.selected() {
        return true;
    }
    let Some(mut judged) = judged_frame(start, end) else {
        return true;
    };
    let paired =
        sender.policy.selected() && receiver.selected() && !judged.exempt && judged.quote == 0;
    if paired && pair_recorded(&mut judged.key, sender.policy, receiver) {
        return true;
    }
    judged.key.receiver_slot = 0;
    let allowed = allows(
        sender.policy,
        POLICY_DIR_EGRESS,
        (start, end, &mut judged),
        false,
        sender.len,
    ) && allows(
        receiver,
        POLICY_DIR_INGRESS,
        (start, end, &mut judged),
        false,
        sender.len,
    );
    if allowed && paired {
        let key = &mut judged.key;
        key.slot = sender.policy.slot;
        key.direction = POLICY_DIR_PAIR as u8;
        key.receiver_slot = receiver.slot;
        let value = PolicyFlow {
            generation: sender.policy.generation,
            flags: receiver.generation,
        };
        // As for the other records: a failed write only costs the next
        // packet the two lookups.
        let _ = POLICY_FLOWS.insert(&*key, &value, 0);
    }
    allowed
}

/// Whether `key` (the packet's) has a pair record of `sender` to
/// `receiver` under both pods' current generations; leaves `key` set up
/// as the pair record's.
#[inline(always)]
fn pair_recorded(key: &mut PolicyFlowKey, sender: PodPolicy, receiver: PodPolicy) -> bool {
    key.slot = sender.slot;
    key.direction = POLICY_DIR_PAIR as u8;
    key.receiver_slot = receiver.slot;
    match POLICY_FLOWS.get_ptr(&*key) {
        Some(known) => {
            // SAFETY: a valid map value for the program's run; read once.
            let known = unsafe { core::ptr::read_volatile(known) };
            known.generation == sender.generation && known.flags == receiver.generation
        }
        None => false,
    }
}

/// What the receiving pod's (counter slot `slot`) ingress policy says of a
/// frame the datapath hands to it from another pod or node.
#[inline(always)]
pub(crate) fn ingress_allowed(start: usize, end: usize, slot: u32, len: u32) -> bool {
    frame_allowed(start, end, of_slot(slot), POLICY_DIR_INGRESS, false, len)
}

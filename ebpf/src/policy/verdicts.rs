//! The tables' verdict on a flow key, the flows already judged, and
//! what a drop reports and counts.

use aya_ebpf::btf_maps::lpm_trie::Key;
use aya_ebpf::helpers::generated::bpf_ktime_get_ns;
use flatnet_common::{
    POLICY_DIR_EGRESS, POLICY_DIR_INGRESS, POLICY_F_EGRESS, POLICY_F_INGRESS, POLICY_FLOW_F_REPLY,
    POLICY_KEY_FIXED_BITS, POLICY_MAX_RANGES, POLICY_REASON_EXCEPT, POLICY_REASON_NO_PREFIX,
    POLICY_REASON_PORT, PolicyCidrV4, PolicyCidrV6, PolicyEvent, PolicyFlow, PolicyFlowKey,
    PolicyPeerKey, PolicyPorts,
};

use crate::counters::count;
use crate::maps::policy::{
    PEER_IDS_V4, PEER_IDS_V6, POLICY_DROPS, POLICY_EVENTS, POLICY_FLOWS, POLICY_PEERS, POLICY_V4,
    POLICY_V6,
};
use crate::policy::keys::{Judged, has_ports, quoted_v4, quoted_v6};
use crate::sender::PodPolicy;

/// The `POLICY_F_*` bit of `direction`.
#[inline(always)]
pub(super) fn isolates(pod: PodPolicy, direction: u32) -> bool {
    let bit = if direction == POLICY_DIR_INGRESS {
        POLICY_F_INGRESS
    } else {
        POLICY_F_EGRESS
    };
    pod.flags & bit != 0
}

/// The other direction.
#[inline(always)]
pub(super) fn other(direction: u32) -> u32 {
    if direction == POLICY_DIR_INGRESS {
        POLICY_DIR_EGRESS
    } else {
        POLICY_DIR_INGRESS
    }
}

/// Allowed (else one of `POLICY_REASON_*`).
pub(super) const ALLOWED: u8 = 0;

/// Whether the entry `set` allows `protocol` to `port` (host order):
/// `ALLOWED`, or why not.
#[inline(always)]
pub(super) fn set_verdict(set: *const PolicyPorts, protocol: u8, port: u16) -> u8 {
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
/// what the longest prefix holding `peer` allows, together with what the
/// peer's identity is allowed. `ALLOWED`, or why not (the prefix's reason
/// unless the identity has an entry: then a port it does not allow).
#[inline(always)]
pub(super) fn table_verdict(
    pod: PodPolicy,
    direction: u32,
    family: u8,
    peer: &[u8; 16],
    protocol: u8,
    port: u16,
) -> u8 {
    let by_prefix = prefix_verdict(pod, direction, family, peer, protocol, port);
    if by_prefix == ALLOWED {
        return ALLOWED;
    }
    let identity = if family == 4 {
        PEER_IDS_V4.get_ptr(&[peer[0], peer[1], peer[2], peer[3]])
    } else {
        PEER_IDS_V6.get_ptr(peer)
    };
    let Some(identity) = identity else {
        return by_prefix;
    };
    let key = PolicyPeerKey {
        slot: pod.slot,
        direction,
        // SAFETY: a valid map value for the program's run; read once.
        identity: unsafe { core::ptr::read_volatile(identity) },
    };
    match POLICY_PEERS.get_ptr(&key) {
        Some(set) => set_verdict(set, protocol, port),
        None => by_prefix,
    }
}

/// The verdict of the longest prefix of the pod's `direction` table
/// holding `peer`.
#[inline(always)]
fn prefix_verdict(
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
pub(super) fn reversed(key: &PolicyFlowKey) -> PolicyFlowKey {
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
pub(super) fn error_of_recorded_flow(
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
pub(super) fn allows(
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
pub(super) fn report_drop(key: &PolicyFlowKey, reason: u8, len: u32) {
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
        count(flatnet_common::action::POLICY_EVENTS_LOST, len);
    }
}

#[inline(always)]
pub(super) fn count_drop(slot: u32, direction: u32, len: u32) {
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

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

use flatnet_common::{
    LocalAddrKey, NO_COUNTER_SLOT, POLICY_DIR_EGRESS, POLICY_DIR_INGRESS, POLICY_DIR_PAIR,
    PolicyFlow, PolicyFlowKey,
};

use crate::maps::policy::{LOCAL_ADDRS, POLICY_FLOWS, POLICY_PODS};
use crate::policy::keys::judged_frame;
use crate::policy::verdicts::allows;
use crate::sender::Sender;

mod keys;
mod verdicts;

use crate::sender::PodPolicy;

/// More-fragments flag and fragment offset; the offset alone.
const IPV4_OFFSET_MASK: u16 = 0x1fff;

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
    is_node_address(&key.src, key.family)
}

/// Whether `address` (IPv4 in the first 4 bytes when `family` is 4) is one
/// of the node's own.
#[inline(always)]
pub(crate) fn is_node_address(address: &[u8; 16], family: u8) -> bool {
    let key: LocalAddrKey = if family == 4 {
        let s = address;
        [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, s[0], s[1], s[2], s[3],
        ]
    } else {
        *address
    };
    // SAFETY: only whether there is an entry is read.
    unsafe { LOCAL_ADDRS.get(key) }.is_some()
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

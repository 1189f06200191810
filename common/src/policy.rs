//! NetworkPolicy: a pod's isolation, its allowed peers and ports by
//! prefix, the flows already judged, drops and events.

/// The entry of a pod in `POLICY_PODS` (an array by counter slot): which of
/// its directions a policy isolates (`POLICY_F_*`; 0: selected by no
/// policy, the only lookup such a pod's packets pay) and the generation of
/// its policy, which the flows recorded in `POLICY_FLOWS` carry: a flow of
/// an older generation is judged again (see `PolicyFlow`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyPod {
    pub flags: u32,
    pub generation: u32,
}
const _: () = assert!(size_of::<PolicyPod>() == 8);

/// Traffic into the pod is only what its ingress table allows.
pub const POLICY_F_INGRESS: u32 = 1;
/// Traffic from the pod is only what its egress table allows.
pub const POLICY_F_EGRESS: u32 = 2;

/// `direction` of policy keys: traffic into the pod, from the pod.
pub const POLICY_DIR_INGRESS: u32 = 0;
pub const POLICY_DIR_EGRESS: u32 = 1;
/// A `POLICY_FLOWS` record of both judgements of a pod-to-pod packet on
/// one node: the sender's egress (`slot`, the `generation`) and the local
/// receiver's ingress (`receiver_slot`, its generation in `flags`), so the
/// redirect path checks one record instead of two.
pub const POLICY_DIR_PAIR: u32 = 2;

/// The most port ranges one policy entry holds (the agent's
/// `MAX_PORT_RANGES`).
pub const POLICY_MAX_RANGES: usize = 16;

/// Entries per family of `POLICY_V4`/`POLICY_V6`, all pods together
/// (allocated as used: LPM tries are never preallocated).
pub const MAX_POLICY_ENTRIES: u32 = 65536;

/// Key data of `POLICY_V4`: the pod's counter slot and the direction, both
/// always matched in full (the prefix length counts their 64 bits), then
/// the peer's address, matched up to the entry's prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyCidrV4 {
    pub slot: u32,
    pub direction: u32,
    pub address: [u8; 4],
}
const _: () = assert!(size_of::<PolicyCidrV4>() == 12);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyCidrV6 {
    pub slot: u32,
    pub direction: u32,
    pub address: [u8; 16],
}
const _: () = assert!(size_of::<PolicyCidrV6>() == 24);

/// Key of `POLICY_PEERS`: what the pod in counter slot `slot` allows in
/// `direction` for the peers of identity `identity` (the number
/// `PEER_IDS_V4`/`PEER_IDS_V6` give their addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct PolicyPeerKey {
    pub slot: u32,
    pub direction: u32,
    pub identity: u32,
}
const _: () = assert!(size_of::<PolicyPeerKey>() == 12);

/// Entries of `POLICY_PEERS`, all pods together: a pod's entries grow
/// with the identities its rules select, not with the pods that have them
/// (allocated as used).
pub const MAX_POLICY_PEERS: u32 = 65536;

/// Entries per family of `PEER_IDS_V4`/`PEER_IDS_V6`: one per address of
/// a pod whose identity a local pod's policy names (allocated as used).
pub const MAX_PEER_IDS: u32 = 262144;

/// Bits of an LPM key's prefix before the address: slot and direction.
pub const POLICY_KEY_FIXED_BITS: u32 = 64;

/// Ports `first..=last` (host byte order) of IP protocol `protocol`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyRange {
    pub protocol: u8,
    pub _pad: u8,
    pub first: u16,
    pub last: u16,
}
const _: () = assert!(size_of::<PolicyRange>() == 6);

/// What a policy entry allows to or from its prefix: everything (`any` 1:
/// every protocol, ICMP included), or the first `count` of `ranges`
/// (count 0: nothing, an explicit deny, e.g. an ipBlock's `except`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyPorts {
    pub any: u8,
    pub count: u8,
    pub _pad: [u8; 2],
    pub ranges: [PolicyRange; POLICY_MAX_RANGES],
}
const _: () = assert!(size_of::<PolicyPorts>() == 100);
const _: () = assert!(core::mem::align_of::<PolicyPorts>() <= 4);

/// Entries of `POLICY_FLOWS` (an LRU: an idle flow is forgotten, and its
/// next packet is judged again).
pub const MAX_POLICY_FLOWS: u32 = 65536;

/// A flow allowed by a pod's policy in one direction: the packet's own
/// addresses (IPv4 in the first 4 bytes), ports (network byte order; 0 for
/// protocols without), protocol, family (4 or 6), and whose judgement it
/// is (`slot`, `direction`: `POLICY_DIR_*`; `receiver_slot` only for
/// `POLICY_DIR_PAIR`, else 0).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyFlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub protocol: u8,
    pub family: u8,
    pub direction: u8,
    pub _pad: u8,
    pub slot: u32,
    pub receiver_slot: u32,
}
const _: () = assert!(size_of::<PolicyFlowKey>() == 48);

/// The policy generation (`PolicyPod::generation`) a flow was allowed
/// under, and `POLICY_FLOW_F_REPLY` when the entry was written for the
/// replies of a flow allowed in the other direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyFlow {
    pub generation: u32,
    pub flags: u32,
}
const _: () = assert!(size_of::<PolicyFlow>() == 8);

/// The entry allows the replies of a flow the other direction allowed.
pub const POLICY_FLOW_F_REPLY: u32 = 1;

/// What policy dropped of a pod's traffic, per CPU, by counter slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyDrops {
    pub ingress_packets: u64,
    pub ingress_bytes: u64,
    pub egress_packets: u64,
    pub egress_bytes: u64,
}
const _: () = assert!(size_of::<PolicyDrops>() == 32);

/// Bytes of the `POLICY_EVENTS` ring buffer (a power of two, a multiple
/// of the page size): 4096 events of 56 bytes and their 8-byte headers.
pub const POLICY_EVENTS_BYTES: u32 = 256 * 1024;

/// One packet NetworkPolicy dropped, as `POLICY_EVENTS` carries it: when
/// (`bpf_ktime_get_ns`, CLOCK_MONOTONIC), whose (`slot`: the pod's counter
/// slot; `direction`: `POLICY_DIR_*`), the packet's own addresses (IPv4 in
/// the first 4 bytes; the peer is `src` for ingress, `dst` for egress),
/// ports (network byte order; 0 for protocols without), protocol, family (4
/// or 6), its length, and why (`POLICY_REASON_*`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyEvent {
    pub timestamp_ns: u64,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub protocol: u8,
    pub family: u8,
    pub direction: u8,
    pub reason: u8,
    pub slot: u32,
    pub len: u32,
}
const _: () = assert!(size_of::<PolicyEvent>() == 56);

/// Why policy dropped a packet: no entry's prefix holds the peer.
pub const POLICY_REASON_NO_PREFIX: u8 = 1;
/// The longest prefix holding the peer does not allow the protocol and port.
pub const POLICY_REASON_PORT: u8 = 2;
/// The longest prefix holding the peer is an explicit deny (an ipBlock's
/// `except`).
pub const POLICY_REASON_EXCEPT: u8 = 3;

//! NetworkPolicy's maps: each pod's state, the rules by peer CIDR, the
//! flows already judged, the drops and their events, and the node's own
//! addresses (see `policy`).

use aya_ebpf::btf_maps::lpm_trie::Key;
use aya_ebpf::btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf};
use aya_ebpf::macros::btf_map;
use flatnet_common::{
    LocalAddrKey, PolicyCidrV4, PolicyCidrV6, PolicyDrops, PolicyEvent, PolicyFlow, PolicyFlowKey,
    PolicyPod, PolicyPorts, maps,
};

/// Each pod's isolation and policy generation, by counter slot.
#[btf_map]
pub(crate) static POLICY_PODS: Array<PolicyPod, { maps::POLICY_PODS.max_entries as usize }> =
    Array::new();
const _: () = assert!(maps::POLICY_PODS.holds::<u32, PolicyPod>());

/// (slot, direction, IPv4 peer prefix) -> what it allows.
#[btf_map]
pub(crate) static POLICY_V4: LpmTrie<
    PolicyCidrV4,
    PolicyPorts,
    { maps::POLICY_V4.max_entries as usize },
> = LpmTrie::new();
const _: () = assert!(maps::POLICY_V4.holds::<Key<PolicyCidrV4>, PolicyPorts>());

/// (slot, direction, IPv6 peer prefix) -> what it allows.
#[btf_map]
pub(crate) static POLICY_V6: LpmTrie<
    PolicyCidrV6,
    PolicyPorts,
    { maps::POLICY_V6.max_entries as usize },
> = LpmTrie::new();
const _: () = assert!(maps::POLICY_V6.holds::<Key<PolicyCidrV6>, PolicyPorts>());

/// Flows policy allowed, per pod and direction (see above).
#[btf_map]
pub(crate) static POLICY_FLOWS: LruHashMap<
    PolicyFlowKey,
    PolicyFlow,
    { maps::POLICY_FLOWS.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::POLICY_FLOWS.holds::<PolicyFlowKey, PolicyFlow>());

/// What policy dropped, per pod and direction.
#[btf_map]
pub(crate) static POLICY_DROPS: PerCpuArray<
    PolicyDrops,
    { maps::POLICY_DROPS.max_entries as usize },
> = PerCpuArray::new();
const _: () = assert!(maps::POLICY_DROPS.holds::<u32, PolicyDrops>());

/// One event per packet policy dropped, for `flatnet monitor`. Written with
/// `bpf_ringbuf_output`, which never blocks: when the buffer is full (no
/// reader, or a slow one) the event is lost and counted in `STATS`
/// (`POLICY_EVENTS_LOST`).
#[btf_map]
pub(crate) static POLICY_EVENTS: RingBuf<
    PolicyEvent,
    { maps::POLICY_EVENTS.max_entries as usize },
> = RingBuf::new();
const _: () = assert!(maps::POLICY_EVENTS.holds::<(), ()>());

/// The node's own addresses: traffic from them into a pod (kubelet's
/// probes) is always allowed.
#[btf_map]
pub(crate) static LOCAL_ADDRS: HashMap<
    LocalAddrKey,
    u32,
    { maps::LOCAL_ADDRS.max_entries as usize },
> = HashMap::new();
const _: () = assert!(maps::LOCAL_ADDRS.holds::<LocalAddrKey, u32>());

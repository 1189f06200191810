//! Services: frontends and their backends (`SERVICES`,
//! `SERVICE_BACKENDS`), what each socket was sent to (`SERVICE_REVNAT`),
//! sessionAffinity (`SERVICE_AFFINITY`), the node addresses NodePorts
//! answer on (`NODEPORT_ADDRS`), and the node's own sources and network
//! namespace (see `services`).

use aya_ebpf::bindings::BPF_F_NO_PREALLOC;
use aya_ebpf::btf_maps::{Array, HashMap, LruHashMap};
use aya_ebpf::macros::btf_map;
use flatnet_common::{
    Affinity, AffinityKey, BackendKey, NodePortAddress, RevNat, RevNatKey, ServiceBackend,
    ServiceKey, ServiceValue, maps,
};

/// Frontends: (ClusterIP, port, protocol) -> where its backends are.
#[btf_map]
pub(crate) static SERVICES: HashMap<
    ServiceKey,
    ServiceValue,
    { maps::SERVICES.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::SERVICES.holds::<ServiceKey, ServiceValue>());

/// Backend sets: (set id, index) -> backend.
#[btf_map]
pub(crate) static SERVICE_BACKENDS: HashMap<
    BackendKey,
    ServiceBackend,
    { maps::SERVICE_BACKENDS.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::SERVICE_BACKENDS.holds::<BackendKey, ServiceBackend>());

/// (socket cookie, backend) -> the ClusterIP and port it stands for.
#[btf_map]
pub(crate) static SERVICE_REVNAT: LruHashMap<
    RevNatKey,
    RevNat,
    { maps::SERVICE_REVNAT.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::SERVICE_REVNAT.holds::<RevNatKey, RevNat>());

/// Each client's backend of a frontend with sessionAffinity ClientIP.
#[btf_map]
pub(crate) static SERVICE_AFFINITY: LruHashMap<
    AffinityKey,
    Affinity,
    { maps::SERVICE_AFFINITY.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::SERVICE_AFFINITY.holds::<AffinityKey, Affinity>());

/// The node addresses NodePorts answer on.
#[btf_map]
pub(crate) static NODEPORT_ADDRS: HashMap<
    NodePortAddress,
    u32,
    { maps::NODEPORT_ADDRS.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::NODEPORT_ADDRS.holds::<NodePortAddress, u32>());

/// The node's own source address per family (0: IPv4, 1: IPv6; all zero:
/// none), written by the agent.
#[btf_map]
pub(crate) static NODE_SOURCES: Array<[u8; 16], { maps::NODE_SOURCES.max_entries as usize }> =
    Array::new();
const _: () = assert!(maps::NODE_SOURCES.holds::<u32, [u8; 16]>());

/// The node's own processes' network namespace (`bpf_get_netns_cookie`),
/// set by the loader (`flatnet_common::GLOBAL_NODE_NETNS_COOKIE`).
#[unsafe(no_mangle)]
pub(crate) static NODE_NETNS_COOKIE: u64 = 0;

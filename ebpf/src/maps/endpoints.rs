//! Local pods and the datapath's counters: `ENDPOINTS_*` by address,
//! `HOST_VETHS` and `POD_SOURCES` by host veth and counter slot, `STATS`
//! and `ENDPOINT_STATS`; and `COST_VARIANT`, the measurement a load runs.

use aya_ebpf::btf_maps::{Array, HashMap, PerCpuArray};
use aya_ebpf::macros::btf_map;
use flatnet_common::{
    Counter, Endpoint, EndpointCounters, Ipv4Key, Ipv6Key, PodSources, cost_variant, maps,
};

/// Local pods by IPv4 address.
#[btf_map]
pub(crate) static ENDPOINTS_V4: HashMap<
    Ipv4Key,
    Endpoint,
    { maps::ENDPOINTS_V4.max_entries as usize },
> = HashMap::new();
const _: () = assert!(maps::ENDPOINTS_V4.holds::<Ipv4Key, Endpoint>());

/// Local pods by IPv6 address.
#[btf_map]
pub(crate) static ENDPOINTS_V6: HashMap<
    Ipv6Key,
    Endpoint,
    { maps::ENDPOINTS_V6.max_entries as usize },
> = HashMap::new();
const _: () = assert!(maps::ENDPOINTS_V6.holds::<Ipv6Key, Endpoint>());

/// The pod behind each host veth, by the veth's ifindex: who is asking when
/// a frame arrives (neighbour answers need the host veth's MAC).
#[btf_map]
pub(crate) static HOST_VETHS: HashMap<u32, Endpoint, { maps::HOST_VETHS.max_entries as usize }> =
    HashMap::new();
const _: () = assert!(maps::HOST_VETHS.holds::<u32, Endpoint>());

/// Per-CPU packet/byte counters, indexed by `flatnet_common::action`.
#[btf_map]
pub(crate) static STATS: PerCpuArray<Counter, { maps::STATS.max_entries as usize }> =
    PerCpuArray::new();
const _: () = assert!(maps::STATS.holds::<u32, Counter>());

/// Per-CPU traffic of each pod, by its `counter_slot`.
#[btf_map]
pub(crate) static ENDPOINT_STATS: PerCpuArray<
    EndpointCounters,
    { maps::ENDPOINT_STATS.max_entries as usize },
> = PerCpuArray::new();
const _: () = assert!(maps::ENDPOINT_STATS.holds::<u32, EndpointCounters>());

/// Each pod's own addresses by counter slot: the source check.
#[btf_map]
pub(crate) static POD_SOURCES: Array<PodSources, { maps::POD_SOURCES.max_entries as usize }> =
    Array::new();
const _: () = assert!(maps::POD_SOURCES.holds::<u32, PodSources>());

/// The measurement this load runs (`flatnet_common::cost_variant`; see
/// `variant`): set by the loader of a measurement, 0 in flatnet's own.
#[unsafe(no_mangle)]
pub(crate) static COST_VARIANT: u32 = cost_variant::FULL;

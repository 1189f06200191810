//! Every map's kind, sizes and name, as the loader checks a pinned map
//! against them.

use crate::*;

/// The kind of a BPF map (`BPF_MAP_TYPE_*`), as the loader checks a pinned
/// map against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash,
    LruHash,
    Array,
    PerCpuArray,
    LpmTrie,
    /// A ring buffer: no key or value, `max_entries` is its size in bytes.
    RingBuf,
    /// Programs to tail-call, by index.
    ProgArray,
}

/// One map of the datapath: what the eBPF side declares (its statics take
/// `max_entries` from here and assert their key and value types against
/// it) and what the loader expects of a pinned map before it reuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: &'static str,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

impl MapSpec {
    /// True when `K` and `V` are this map's key and value (by size: the
    /// eBPF side's compile-time check).
    pub const fn holds<K, V>(&self) -> bool {
        self.key_size as usize == size_of::<K>() && self.value_size as usize == size_of::<V>()
    }

    const fn new<K, V>(name: &'static str, kind: MapKind, max_entries: u32) -> Self {
        MapSpec {
            name,
            kind,
            key_size: size_of::<K>() as u32,
            value_size: size_of::<V>() as u32,
            max_entries,
        }
    }
}

/// The key of an LPM trie: a prefix length, then the address.
#[repr(C)]
pub struct LpmKey<T> {
    pub prefix_len: u32,
    pub data: T,
}

/// The datapath's maps, one spec each (see `MapSpec`).
pub mod maps {
    use super::*;

    pub const ENDPOINTS_V4: MapSpec =
        MapSpec::new::<Ipv4Key, Endpoint>(MAP_ENDPOINTS_V4, MapKind::Hash, MAX_ENDPOINTS);
    pub const ENDPOINTS_V6: MapSpec =
        MapSpec::new::<Ipv6Key, Endpoint>(MAP_ENDPOINTS_V6, MapKind::Hash, MAX_ENDPOINTS);
    pub const HOST_VETHS: MapSpec =
        MapSpec::new::<u32, Endpoint>(MAP_HOST_VETHS, MapKind::Hash, MAX_ENDPOINTS);
    pub const STATS: MapSpec =
        MapSpec::new::<u32, Counter>(MAP_STATS, MapKind::PerCpuArray, action::COUNT);
    pub const ENDPOINT_STATS: MapSpec = MapSpec::new::<u32, EndpointCounters>(
        MAP_ENDPOINT_STATS,
        MapKind::PerCpuArray,
        MAX_ENDPOINTS,
    );
    pub const POD_SOURCES: MapSpec =
        MapSpec::new::<u32, PodSources>(MAP_POD_SOURCES, MapKind::Array, MAX_ENDPOINTS);
    pub const FLOWS: MapSpec =
        MapSpec::new::<FlowKey, FlowVerdict>(MAP_FLOWS, MapKind::LruHash, MAX_FLOWS);
    pub const REMOTE_CIDRS_V4: MapSpec = MapSpec::new::<LpmKey<RemoteCidrV4>, RemoteNode>(
        MAP_REMOTE_CIDRS_V4,
        MapKind::LpmTrie,
        MAX_REMOTE_CIDRS,
    );
    pub const REMOTE_CIDRS_V6: MapSpec = MapSpec::new::<LpmKey<RemoteCidrV6>, RemoteNode>(
        MAP_REMOTE_CIDRS_V6,
        MapKind::LpmTrie,
        MAX_REMOTE_CIDRS,
    );
    pub const PEER_NODES_V4: MapSpec =
        MapSpec::new::<Ipv4Key, u32>(MAP_PEER_NODES_V4, MapKind::Hash, MAX_PEER_NODES);
    pub const PEER_NODES_V6: MapSpec =
        MapSpec::new::<Ipv6Key, u32>(MAP_PEER_NODES_V6, MapKind::Hash, MAX_PEER_NODES);
    pub const POLICY_PODS: MapSpec =
        MapSpec::new::<u32, PolicyPod>(MAP_POLICY_PODS, MapKind::Array, MAX_ENDPOINTS);
    pub const POLICY_V4: MapSpec = MapSpec::new::<LpmKey<PolicyCidrV4>, PolicyPorts>(
        MAP_POLICY_V4,
        MapKind::LpmTrie,
        MAX_POLICY_ENTRIES,
    );
    pub const POLICY_V6: MapSpec = MapSpec::new::<LpmKey<PolicyCidrV6>, PolicyPorts>(
        MAP_POLICY_V6,
        MapKind::LpmTrie,
        MAX_POLICY_ENTRIES,
    );
    pub const POLICY_FLOWS: MapSpec = MapSpec::new::<PolicyFlowKey, PolicyFlow>(
        MAP_POLICY_FLOWS,
        MapKind::LruHash,
        MAX_POLICY_FLOWS,
    );
    pub const POLICY_DROPS: MapSpec =
        MapSpec::new::<u32, PolicyDrops>(MAP_POLICY_DROPS, MapKind::PerCpuArray, MAX_ENDPOINTS);
    pub const LOCAL_ADDRS: MapSpec =
        MapSpec::new::<LocalAddrKey, u32>(MAP_LOCAL_ADDRS, MapKind::Hash, MAX_LOCAL_ADDRS);
    pub const POLICY_EVENTS: MapSpec =
        MapSpec::new::<(), ()>(MAP_POLICY_EVENTS, MapKind::RingBuf, POLICY_EVENTS_BYTES);
    pub const SERVICES: MapSpec =
        MapSpec::new::<ServiceKey, ServiceValue>(MAP_SERVICES, MapKind::Hash, MAX_SERVICES);
    pub const SERVICE_BACKENDS: MapSpec = MapSpec::new::<BackendKey, ServiceBackend>(
        MAP_SERVICE_BACKENDS,
        MapKind::Hash,
        MAX_SERVICE_BACKENDS,
    );
    pub const SERVICE_REVNAT: MapSpec =
        MapSpec::new::<RevNatKey, RevNat>(MAP_SERVICE_REVNAT, MapKind::LruHash, MAX_SERVICE_REVNAT);
    pub const TUNNEL: MapSpec = MapSpec::new::<u32, TunnelConfig>(MAP_TUNNEL, MapKind::Array, 1);
    pub const SERVICE_AFFINITY: MapSpec = MapSpec::new::<AffinityKey, Affinity>(
        MAP_SERVICE_AFFINITY,
        MapKind::LruHash,
        MAX_SERVICE_AFFINITY,
    );
    pub const NODEPORT_ADDRS: MapSpec =
        MapSpec::new::<NodePortAddress, u32>(MAP_NODEPORT_ADDRS, MapKind::Hash, MAX_NODEPORT_ADDRS);
    pub const EXTERNAL_PORTS: MapSpec =
        MapSpec::new::<u32, u32>(MAP_EXTERNAL_PORTS, MapKind::Array, EXTERNAL_PORT_COUNT);
    pub const NAT_FORWARD: MapSpec =
        MapSpec::new::<NatKey, NatForward>(MAP_NAT_FORWARD, MapKind::LruHash, MAX_NAT_FLOWS);
    pub const NAT_REVERSE: MapSpec =
        MapSpec::new::<NatKey, NatReverse>(MAP_NAT_REVERSE, MapKind::LruHash, MAX_NAT_FLOWS);
    pub const NAT_FRAGMENTS: MapSpec = MapSpec::new::<FragmentKey, FragmentPorts>(
        MAP_NAT_FRAGMENTS,
        MapKind::LruHash,
        MAX_NAT_FRAGMENTS,
    );
    pub const NAT_FRAGMENTS6: MapSpec = MapSpec::new::<FragmentKey6, FragmentPorts>(
        MAP_NAT_FRAGMENTS6,
        MapKind::LruHash,
        MAX_NAT_FRAGMENTS,
    );
    pub const NODE_SOURCES: MapSpec =
        MapSpec::new::<u32, [u8; 16]>(MAP_NODE_SOURCES, MapKind::Array, 2);
    pub const NAT_LOCAL_SOURCES: MapSpec =
        MapSpec::new::<u32, [u8; 16]>(MAP_NAT_LOCAL_SOURCES, MapKind::Array, 2);
    pub const NAT_CLAIMS: MapSpec =
        MapSpec::new::<NatKey, u32>(MAP_NAT_CLAIMS, MapKind::Hash, NAT_CLAIMS_MAX);
    pub const NODEPORT_CALLS: MapSpec = MapSpec::new::<u32, u32>(
        MAP_NODEPORT_CALLS,
        MapKind::ProgArray,
        nodeport_call::PROGRAMS.len() as u32,
    );
}

/// Every map, in the order they are pinned.
pub const MAP_SPECS: [MapSpec; 33] = [
    maps::ENDPOINTS_V4,
    maps::ENDPOINTS_V6,
    maps::HOST_VETHS,
    maps::STATS,
    maps::ENDPOINT_STATS,
    maps::POD_SOURCES,
    maps::FLOWS,
    maps::REMOTE_CIDRS_V4,
    maps::REMOTE_CIDRS_V6,
    maps::POLICY_PODS,
    maps::POLICY_V4,
    maps::POLICY_V6,
    maps::POLICY_FLOWS,
    maps::POLICY_DROPS,
    maps::LOCAL_ADDRS,
    maps::POLICY_EVENTS,
    maps::SERVICES,
    maps::SERVICE_BACKENDS,
    maps::SERVICE_REVNAT,
    maps::SERVICE_AFFINITY,
    maps::TUNNEL,
    maps::NODEPORT_ADDRS,
    maps::EXTERNAL_PORTS,
    maps::NAT_FORWARD,
    maps::NAT_REVERSE,
    maps::NAT_FRAGMENTS,
    maps::NODEPORT_CALLS,
    maps::NODE_SOURCES,
    maps::NAT_FRAGMENTS6,
    maps::PEER_NODES_V4,
    maps::PEER_NODES_V6,
    maps::NAT_LOCAL_SOURCES,
    maps::NAT_CLAIMS,
];

//! Every map's kind, sizes and name, as the loader checks a pinned map
//! against them.

use core::mem::size_of;

use crate::{
    Affinity, AffinityKey, BackendKey, Counter, EXTERNAL_PORT_COUNT, Endpoint, EndpointCounters,
    FlowKey, FlowVerdict, FragmentKey, FragmentKey6, FragmentPorts, Ipv4Key, Ipv6Key, LocalAddrKey,
    MAX_ENDPOINTS, MAX_FLOWS, MAX_LOCAL_ADDRS, MAX_NAT_FLOWS, MAX_NAT_FRAGMENTS,
    MAX_NODEPORT_ADDRS, MAX_PEER_IDS, MAX_PEER_NODES, MAX_POLICY_ENTRIES, MAX_POLICY_FLOWS,
    MAX_POLICY_PEERS, MAX_REMOTE_CIDRS, MAX_SERVICE_AFFINITY, MAX_SERVICE_BACKENDS,
    MAX_SERVICE_REVNAT, MAX_SERVICES, NAT_CLAIMS_MAX, NatForward, NatKey, NatReverse,
    NodePortAddress, POLICY_EVENTS_BYTES, PodSources, PolicyCidrV4, PolicyCidrV6, PolicyDrops,
    PolicyEvent, PolicyFlow, PolicyFlowKey, PolicyPeerKey, PolicyPod, PolicyPorts, RemoteCidrV4,
    RemoteCidrV6, RemoteNode, RevNat, RevNatKey, ServiceBackend, ServiceKey, ServiceValue,
    TunnelConfig, action, nodeport_call,
};

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
/// their key and value types and `max_entries` from its `TypedMap`) and
/// what the loader expects of a pinned map before it reuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: &'static str,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// `BPF_F_*` map flags (`map_flags`).
    pub flags: u32,
}

/// `BPF_F_NO_PREALLOC`: entries are allocated as they are added (a hash
/// map much larger than it usually holds; every LPM trie has it).
pub const BPF_F_NO_PREALLOC: u32 = 1;

impl MapSpec {
    #[doc(hidden)]
    pub const fn new<K, V>(
        name: &'static str,
        kind: MapKind,
        max_entries: u32,
        flags: u32,
    ) -> Self {
        MapSpec {
            name,
            kind,
            key_size: size_of::<K>() as u32,
            value_size: size_of::<V>() as u32,
            max_entries,
            // The kernel takes no LPM trie without it.
            flags: match kind {
                MapKind::LpmTrie => flags | BPF_F_NO_PREALLOC,
                _ => flags,
            },
        }
    }
}

/// The key of an LPM trie: a prefix length, then the address.
#[repr(C)]
pub struct LpmKey<T> {
    pub prefix_len: u32,
    pub data: T,
}

/// A map's spec as a type: its key and value types with the spec (name,
/// kind, sizes). Each map of `map_specs!` below is one, named as the map
/// (`maps::FLOWS` is both the type and the `MapSpec` value).
pub trait TypedMap {
    /// The key (`u32` for arrays, `LpmKey<T>` for LPM tries, `()` for a
    /// ring buffer).
    type Key;
    /// The value (`()` for a ring buffer, whose entries are `Event`).
    type Value;
    /// What a ring buffer's entries are (`()` for every other kind).
    type Event;
    /// The kind as a type (`kind::Hash`, ...): the eBPF side picks its
    /// static's type by it.
    type Kind;
    const SPEC: MapSpec;
}

/// A map's kind as a type, one per `MapKind` (`TypedMap::Kind`).
pub mod kind {
    pub struct Hash;
    pub struct LruHash;
    pub struct Array;
    pub struct PerCpuArray;
    pub struct LpmTrie;
    pub struct RingBuf;
    pub struct ProgArray;
}

/// A map's key type (`<M as TypedMap>::Key`).
pub type KeyOf<M> = <M as TypedMap>::Key;
/// A map's value type (`<M as TypedMap>::Value`).
pub type ValueOf<M> = <M as TypedMap>::Value;
/// A ring buffer's entry type (`<M as TypedMap>::Event`).
pub type EventOf<M> = <M as TypedMap>::Event;
/// A map's kind as a type (`<M as TypedMap>::Kind`).
pub type KindOf<M> = <M as TypedMap>::Kind;

/// Declares every map once: `MAP_NAME => NAME: Kind<Key, Value>
/// [max_entries]` or `[max_entries, flags]` (a ring buffer: `NAME:
/// RingBuf<Event> [bytes]`), in the order they are pinned.
/// Makes `maps::NAME` (a `TypedMap` type and its `MapSpec`), `MAP_SPECS`
/// (counted here) and, for the names' older users, `MAP_NAME`.
macro_rules! map_specs {
    (@spec $name:ident RingBuf<$event:ty> [$max:expr]) => {
        impl TypedMap for maps::$name {
            type Key = ();
            type Value = ();
            type Event = $event;
            type Kind = kind::RingBuf;
            const SPEC: MapSpec = MapSpec::new::<(), ()>(stringify!($name), MapKind::RingBuf, $max, 0);
        }
    };
    (@spec $name:ident $kind:ident<$key:ty, $value:ty> [$max:expr $(, $flags:expr)?]) => {
        impl TypedMap for maps::$name {
            type Key = $key;
            type Value = $value;
            type Event = ();
            type Kind = kind::$kind;
            const SPEC: MapSpec =
                MapSpec::new::<$key, $value>(
                    stringify!($name),
                    MapKind::$kind,
                    $max,
                    0 $(| $flags)?,
                );
        }
    };
    ($($(#[$doc:meta])* $alias:ident => $name:ident: $kind:ident<$($types:ty),+> [$($size:expr),+];)+) => {
        /// The datapath's maps: each a `TypedMap` type and its `MapSpec`.
        pub mod maps {
            use super::{MapSpec, TypedMap};
            $(
                $(#[$doc])*
                #[allow(non_camel_case_types)]
                pub struct $name {}
                $(#[$doc])*
                pub const $name: MapSpec = <$name as TypedMap>::SPEC;
            )+
        }
        $(map_specs!(@spec $name $kind<$($types),+> [$($size),+]);)+
        $(
            $(#[$doc])*
            pub const $alias: &str = maps::$name.name;
        )+
        /// Every map, in the order they are pinned.
        pub const MAP_SPECS: [MapSpec; [$(stringify!($name)),+].len()] = [$(maps::$name),+];
    };
}

map_specs! {
    MAP_ENDPOINTS_V4 => ENDPOINTS_V4: Hash<Ipv4Key, Endpoint> [MAX_ENDPOINTS];
    MAP_ENDPOINTS_V6 => ENDPOINTS_V6: Hash<Ipv6Key, Endpoint> [MAX_ENDPOINTS];
    MAP_HOST_VETHS => HOST_VETHS: Hash<u32, Endpoint> [MAX_ENDPOINTS];
    MAP_STATS => STATS: PerCpuArray<u32, Counter> [action::COUNT];
    MAP_ENDPOINT_STATS => ENDPOINT_STATS: PerCpuArray<u32, EndpointCounters> [MAX_ENDPOINTS];
    /// Each pod's own addresses, by counter slot: the source check.
    MAP_POD_SOURCES => POD_SOURCES: Array<u32, PodSources> [MAX_ENDPOINTS];
    /// What conntrack said of each TCP and UDP flow the fast path saw (an
    /// LRU cache).
    MAP_FLOWS => FLOWS: LruHash<FlowKey, FlowVerdict> [MAX_FLOWS];
    /// Other nodes' pod CIDRs, filled by the node agent.
    MAP_REMOTE_CIDRS_V4 => REMOTE_CIDRS_V4: LpmTrie<LpmKey<RemoteCidrV4>, RemoteNode> [MAX_REMOTE_CIDRS];
    MAP_REMOTE_CIDRS_V6 => REMOTE_CIDRS_V6: LpmTrie<LpmKey<RemoteCidrV6>, RemoteNode> [MAX_REMOTE_CIDRS];
    /// NetworkPolicy: each pod's isolation by counter slot, its allowed
    /// prefixes (LPM tries), the flows already judged, its drops, and the
    /// node's own addresses (always allowed in).
    MAP_POLICY_PODS => POLICY_PODS: Array<u32, PolicyPod> [MAX_ENDPOINTS];
    MAP_POLICY_V4 => POLICY_V4: LpmTrie<LpmKey<PolicyCidrV4>, PolicyPorts> [MAX_POLICY_ENTRIES];
    MAP_POLICY_V6 => POLICY_V6: LpmTrie<LpmKey<PolicyCidrV6>, PolicyPorts> [MAX_POLICY_ENTRIES];
    /// NetworkPolicy by peer identity: each pod's allowed identities, and
    /// the identity of each peer address a local pod's policy names.
    MAP_POLICY_PEERS => POLICY_PEERS: Hash<PolicyPeerKey, PolicyPorts> [MAX_POLICY_PEERS, BPF_F_NO_PREALLOC];
    MAP_PEER_IDS_V4 => PEER_IDS_V4: Hash<Ipv4Key, u32> [MAX_PEER_IDS, BPF_F_NO_PREALLOC];
    MAP_PEER_IDS_V6 => PEER_IDS_V6: Hash<Ipv6Key, u32> [MAX_PEER_IDS, BPF_F_NO_PREALLOC];
    MAP_POLICY_FLOWS => POLICY_FLOWS: LruHash<PolicyFlowKey, PolicyFlow> [MAX_POLICY_FLOWS];
    MAP_POLICY_DROPS => POLICY_DROPS: PerCpuArray<u32, PolicyDrops> [MAX_ENDPOINTS];
    MAP_LOCAL_ADDRS => LOCAL_ADDRS: Hash<LocalAddrKey, u32> [MAX_LOCAL_ADDRS];
    /// NetworkPolicy drops, one `PolicyEvent` each (a ring buffer `flatnet
    /// monitor` reads).
    MAP_POLICY_EVENTS => POLICY_EVENTS: RingBuf<PolicyEvent> [POLICY_EVENTS_BYTES];
    /// Services at the socket (`--services ebpf`): frontends, their
    /// backends, and which ClusterIP each connected or sending socket's
    /// peer stands for.
    MAP_SERVICES => SERVICES: Hash<ServiceKey, ServiceValue> [MAX_SERVICES, BPF_F_NO_PREALLOC];
    MAP_SERVICE_BACKENDS => SERVICE_BACKENDS: Hash<BackendKey, ServiceBackend> [MAX_SERVICE_BACKENDS, BPF_F_NO_PREALLOC];
    MAP_SERVICE_REVNAT => SERVICE_REVNAT: LruHash<RevNatKey, RevNat> [MAX_SERVICE_REVNAT];
    /// sessionAffinity ClientIP: the backend each client (network
    /// namespace) was given for a frontend, and when it last used it.
    MAP_SERVICE_AFFINITY => SERVICE_AFFINITY: LruHash<AffinityKey, Affinity> [MAX_SERVICE_AFFINITY];
    /// The node's VXLAN device (`TunnelConfig`), one entry.
    MAP_TUNNEL => TUNNEL: Array<u32, TunnelConfig> [1];
    /// The node addresses NodePorts answer on: a frontend keyed by the
    /// unspecified address stands for all of them.
    MAP_NODEPORT_ADDRS => NODEPORT_ADDRS: Hash<NodePortAddress, u32> [MAX_NODEPORT_ADDRS, BPF_F_NO_PREALLOC];
    /// The ports outside clients reach frontends on (`nat::external_port`
    /// bits by port number), and the uplink's translation of each such
    /// flow: forward (by the client's tuple) and reverse (by the backend's
    /// reply).
    MAP_EXTERNAL_PORTS => EXTERNAL_PORTS: Array<u32, u32> [EXTERNAL_PORT_COUNT];
    MAP_NAT_FORWARD => NAT_FORWARD: LruHash<NatKey, NatForward> [MAX_NAT_FLOWS];
    MAP_NAT_REVERSE => NAT_REVERSE: LruHash<NatKey, NatReverse> [MAX_NAT_FLOWS];
    /// The ports of fragmented datagrams of translated flows, for their
    /// later fragments (`nat::FragmentKey`, and `nat::FragmentKey6` for
    /// IPv6's).
    MAP_NAT_FRAGMENTS => NAT_FRAGMENTS: LruHash<FragmentKey, FragmentPorts> [MAX_NAT_FRAGMENTS];
    /// `from_pod`'s tail call: entry 0 is `nodeport_reply` (pinned, so that
    /// the entry lives on after the loader exits).
    MAP_NODEPORT_CALLS => NODEPORT_CALLS: ProgArray<u32, u32> [nodeport_call::PROGRAMS.len() as u32];
    /// The node's own source address per family (index 0 IPv4, 1 IPv6; all
    /// zero: none): its first InternalIP, which a connect() of the node's
    /// own to a ClusterIP whose backend is a local pod is bound to, as
    /// kube-proxy's DNAT keeps the source the route to the ClusterIP picked.
    MAP_NODE_SOURCES => NODE_SOURCES: Array<u32, [u8; 16]> [2];
    MAP_NAT_FRAGMENTS6 => NAT_FRAGMENTS6: LruHash<FragmentKey6, FragmentPorts> [MAX_NAT_FRAGMENTS];
    /// The addresses of the other nodes routed directly on the uplink (the
    /// next hops of non-tunnelled `REMOTE_CIDRS_*` entries), kept with
    /// them: a TCP flow one of them opens to a local pod (a NodePort flow
    /// another node sent on with its own address as the source) takes the
    /// fast path both ways, as pod-to-pod flows do.
    MAP_PEER_NODES_V4 => PEER_NODES_V4: Hash<Ipv4Key, u32> [MAX_PEER_NODES, BPF_F_NO_PREALLOC];
    MAP_PEER_NODES_V6 => PEER_NODES_V6: Hash<Ipv6Key, u32> [MAX_PEER_NODES, BPF_F_NO_PREALLOC];
    /// The source address the kernel selects toward a local pod, per
    /// family (index 0 IPv4, unused: MASQUERADE picks the node's address
    /// there; 1 IPv6; all zero: none seen yet): a translated flow to a
    /// local backend is given it, as kube-proxy's MASQUERADE picks it, when
    /// it is not the frontend's (`NAT_F_LOCAL_SOURCE`). Written by the
    /// NodePort path from the FIB (`BPF_FIB_LOOKUP_SRC`).
    MAP_NAT_LOCAL_SOURCES => NAT_LOCAL_SOURCES: Array<u32, [u8; 16]> [2];
    /// Node ports being taken from spent flows, by the reply tuple, each
    /// for the length of one program run: a new flow writes its claim only
    /// if none is there, so of two CPUs that found the same spent port at
    /// once, one takes it (`NAT_CLAIMS_MAX` at once).
    MAP_NAT_CLAIMS => NAT_CLAIMS: Hash<NatKey, u32> [NAT_CLAIMS_MAX];
}

//! Other nodes: their pod CIDRs (`REMOTE_CIDRS_*`), their own addresses
//! on the uplink (`PEER_NODES_*`), the node's VXLAN device (`TUNNEL`), and
//! whether `from_uplink` may hand packets to pods (`UPLINK_TO_PODS`).

use aya_ebpf::bindings::BPF_F_NO_PREALLOC;
use aya_ebpf::btf_maps::lpm_trie::Key;
use aya_ebpf::btf_maps::{Array, HashMap, LpmTrie};
use aya_ebpf::macros::btf_map;
use flatnet_common::{
    Ipv4Key, Ipv6Key, RemoteCidrV4, RemoteCidrV6, RemoteNode, TunnelConfig, maps,
};

/// Other nodes' IPv4 pod CIDRs: packets for them take the fast path.
#[btf_map]
pub(crate) static REMOTE_CIDRS_V4: LpmTrie<
    RemoteCidrV4,
    RemoteNode,
    { maps::REMOTE_CIDRS_V4.max_entries as usize },
> = LpmTrie::new();
const _: () = assert!(maps::REMOTE_CIDRS_V4.holds::<Key<RemoteCidrV4>, RemoteNode>());

/// Other nodes' IPv6 pod CIDRs.
#[btf_map]
pub(crate) static REMOTE_CIDRS_V6: LpmTrie<
    RemoteCidrV6,
    RemoteNode,
    { maps::REMOTE_CIDRS_V6.max_entries as usize },
> = LpmTrie::new();
const _: () = assert!(maps::REMOTE_CIDRS_V6.holds::<Key<RemoteCidrV6>, RemoteNode>());

/// The addresses of the other nodes routed directly on the uplink: a TCP
/// flow one of them opens to a local pod takes the fast path both ways
/// (`uplink_to_pod`, `pod::ipv4`). Not preallocated: a node has a few
/// peers, not 16,384, and map memory counts against the agent's limit.
#[btf_map]
pub(crate) static PEER_NODES_V4: HashMap<
    Ipv4Key,
    u32,
    { maps::PEER_NODES_V4.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::PEER_NODES_V4.holds::<Ipv4Key, u32>());

#[btf_map]
pub(crate) static PEER_NODES_V6: HashMap<
    Ipv6Key,
    u32,
    { maps::PEER_NODES_V6.max_entries as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
const _: () = assert!(maps::PEER_NODES_V6.holds::<Ipv6Key, u32>());

/// The node's VXLAN device (entry 0; all zero: none), written by the agent.
#[btf_map]
pub(crate) static TUNNEL: Array<TunnelConfig, { maps::TUNNEL.max_entries as usize }> = Array::new();
const _: () = assert!(maps::TUNNEL.holds::<u32, TunnelConfig>());

/// Whether `from_uplink` may hand packets to pods: set by the loader (1 in
/// tc mode, 0 in XDP mode; see `flatnet_common::GLOBAL_UPLINK_TO_PODS`).
/// XDP mode sends every packet for another node through the host stack, so
/// the replies must take the stack too, or its conntrack would see half of
/// each flow.
#[unsafe(no_mangle)]
pub(crate) static UPLINK_TO_PODS: u32 = 1;

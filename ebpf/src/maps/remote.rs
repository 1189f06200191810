//! The maps of other nodes: their pod CIDRs (`REMOTE_CIDRS_*`), their own
//! addresses on the uplink (`PEER_NODES_*`), the node's VXLAN device
//! (`TUNNEL`), and whether `from_uplink` may hand packets to pods
//! (`UPLINK_TO_PODS`).

use super::map;

map!(
    /// Other nodes' IPv4 pod CIDRs: packets for them take the fast path.
    REMOTE_CIDRS_V4
);

map!(
    /// Other nodes' IPv6 pod CIDRs.
    REMOTE_CIDRS_V6
);

map!(
    /// The addresses of the other nodes routed directly on the uplink: a TCP
    /// flow one of them opens to a local pod takes the fast path both ways
    /// (`uplink_to_pod`, `pod::ipv4`). Not preallocated: a node has a few
    /// peers, not 16,384, and map memory counts against the agent's limit.
    PEER_NODES_V4
);

map!(PEER_NODES_V6);

map!(
    /// The node's VXLAN device (entry 0; all zero: none), written by the agent.
    TUNNEL
);

/// Whether `from_uplink` may hand packets to pods: set by the loader (1 in
/// tc mode, 0 in XDP mode; see `flatnet_common::GLOBAL_UPLINK_TO_PODS`).
/// XDP mode sends every packet for another node through the host stack, so
/// the replies must take the stack too, or its conntrack would see half of
/// each flow.
#[unsafe(no_mangle)]
pub(crate) static UPLINK_TO_PODS: u32 = 1;

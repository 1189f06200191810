//! Services' maps (see `services`): frontends and their backends
//! (`SERVICES`, `SERVICE_BACKENDS`), what each socket was sent to
//! (`SERVICE_REVNAT`), sessionAffinity (`SERVICE_AFFINITY`), the node
//! addresses NodePorts answer on (`NODEPORT_ADDRS`), and the node's own
//! sources and network namespace.

use super::map;

map!(
    /// Frontends: (ClusterIP, port, protocol) -> where its backends are.
    SERVICES
);

map!(
    /// Backend sets: (set id, index) -> backend.
    SERVICE_BACKENDS
);

map!(
    /// (socket cookie, backend) -> the ClusterIP and port it stands for.
    SERVICE_REVNAT
);

map!(
    /// Each client's backend of a frontend with sessionAffinity ClientIP.
    SERVICE_AFFINITY
);

map!(
    /// The node addresses NodePorts answer on.
    NODEPORT_ADDRS
);

map!(
    /// The node's own source address per family (0: IPv4, 1: IPv6; all zero:
    /// none), written by the agent.
    NODE_SOURCES
);

/// The node's own processes' network namespace (`bpf_get_netns_cookie`),
/// set by the loader (`flatnet_common::GLOBAL_NODE_NETNS_COOKIE`).
#[unsafe(no_mangle)]
pub(crate) static NODE_NETNS_COOKIE: u64 = 0;

//! NodePorts for clients outside the cluster, served by the uplink program
//! with kube-proxy absent (`--services ebpf`): the flow translated to a
//! backend on this node or another, its replies translated back, and
//! `externalTrafficPolicy` as kube-proxy applies it. The outside client is
//! the simulated underlay's switch namespace, given an address on the
//! nodes' segment: a host on the same network as the nodes, as a load
//! balancer or a user's machine would be.
//!
//! The tests by what they prove: `uplink` (IPv4, both traffic policies,
//! health checks, the tunnel), `ipv6`, `flows` (node ports given back and
//! kept apart), `side_by_side` (the same answers as kube-proxy's rules) and
//! `lifecycle` (connections outliving an upgrade or their Service). Their
//! cluster and API objects are in `fixture`, the servers and client
//! exchanges in `exchanges`, the side-by-side outcome in `outcome`.

pub(crate) mod exchanges;
pub(crate) mod fixture;
mod outcome;

mod flows;
mod ipv6;
mod lifecycle;
mod side_by_side;
mod uplink;

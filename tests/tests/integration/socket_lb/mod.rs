//! Services at the socket: the datapath's cgroup programs, attached to a
//! cgroup v2 of the test's own (the agent attaches them to the node's root
//! cgroup), rewrite a ClusterIP to a backend at connect() and sendmsg() and
//! show the ClusterIP back at getpeername() and recvmsg(). The client is a
//! process of its own (`flatnet-sock-client`) in that cgroup and in a pod's
//! namespace; the backends are pods of the same network. The frontends are
//! written through the Datapath API, as the agent writes them.
//!
//! Each client pod gets a blackhole route for the Service CIDRs: a packet
//! to a ClusterIP that no program rewrote dies in the pod instead of
//! leaving by the node's default route.
//!
//! The tests by what they prove: `rewrite` (the programs alone),
//! `agent` (agents following the API), `node_ports` (NodePorts and
//! external addresses at the socket) and `side_by_side` (the same answers
//! as kube-proxy's rules). The Services the API serves and the clusters
//! following it are in `api`, the servers and clients in `fixture`.

pub(crate) mod api;
pub(crate) mod fixture;

mod agent;
mod node_ports;
mod rewrite;
mod side_by_side;

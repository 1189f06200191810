//! A simulated cluster on this machine: nodes are network namespaces on an
//! underlay (each node's `up0` is a veth into a switch namespace, whose
//! bridge joins them), each node runs `flatnet-agent` (static peer file or a
//! stub of the Kubernetes API server) with its own pin root on a test-owned
//! bpffs, and pods on each node are made through the plugin the agent
//! installed, with the conflist it wrote. Plugins and agents run in the
//! host's mount namespace entered into their node's network namespace only,
//! so the bpffs and the pins are the same for all of them.
//!
//! Node i has underlay address 172.30.0.i/24 (fd30::i/64 when dual-stack)
//! and pod CIDR 10.244.i.0/24 (fd44:0:0:i::/64).

use std::time::Duration;

mod node;
mod peers;
mod pod;
mod sim_cluster;

pub use node::SimNode;
pub use peers::{NodeSpec, Peers, specs};
pub use pod::SimPod;
pub use sim_cluster::Cluster;

/// flatnet's route protocol number (agent::routes::RTPROT_FLATNET).
pub const ROUTE_PROTO: &str = "102";
pub const METRICS_PORT: u16 = 9603;
/// Generous: agents and plugins share two cores with the other suites.
pub const SETTLE: Duration = Duration::from_secs(20);
/// How long an agent may take to get ready: loading the datapath runs the
/// verifier over every program of its mode. Two XDP-mode agents loading
/// at once on a loaded 2-core machine took over 20 s (6 tests of one run
/// under stress-ng, 2026-11-30); alone and unloaded a whole XDP test takes
/// 11 s. Ready earlier, nothing waits longer.
pub const AGENT_READY: Duration = Duration::from_secs(60);

//! The node agent behind `flatnet-agent`: one per node (a DaemonSet pod
//! with host networking on Kubernetes). It learns the cluster's nodes from
//! a [`peers::PeerSource`] (Kubernetes Node objects or a static file),
//! loads and pins the datapath before any pod exists, attaches
//! `from_uplink` to the node's uplink, keeps a route per peer pod CIDR
//! (host-gw) and the fast path's remote-CIDR map, writes the conflist and
//! installs the plugin binaries, reports readiness to CNI STATUS, and
//! serves Prometheus metrics. [`uninstall`] takes all of it away again.
//!
//! Its files by job: `peers/` (the peer sources, Kubernetes or a file, and
//! the routes and remote-CIDR map they plan), `policy/` (NetworkPolicy:
//! the model, the watches, the sync into the datapath), `services/`
//! (Services in eBPF: the model and its sync), `install/` (conflist and
//! plugin binaries, uninstall, the manifests' checks), `reclaim/`
//! (addresses of pods the runtime no longer has, found over CRI), and
//! `run` (the loop that ties them together).
//!
//! Its own crate, on top of the plugin's library: the `flatnet` and
//! `flatnet-ipam` binaries never build its Kubernetes client, HTTP server
//! or metrics. What the plugin and the agent share about a network (its
//! lifecycle, the ready markers) is in `flatnet_datapath::node`.

pub mod config;
pub mod error;
pub mod install;
mod interned;
pub mod metrics;
pub mod node_state;
pub mod peers;
pub mod policy;
pub mod protocol;
pub mod reclaim;
pub mod run;
pub mod services;
mod slim;
mod watch_backoff;

pub use install::uninstall::uninstall;
pub use run::run;

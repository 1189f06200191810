//! The node agent behind `flatnet-agent`: one per node (a DaemonSet pod
//! with host networking on Kubernetes). It learns the cluster's nodes from
//! a [`peers::PeerSource`] (Kubernetes Node objects or a static file),
//! loads and pins the datapath before any pod exists, attaches
//! `from_uplink` to the node's uplink, keeps a route per peer pod CIDR
//! (host-gw) and the fast path's remote-CIDR map, writes the conflist and
//! installs the plugin binaries, reports readiness to CNI STATUS, and
//! serves Prometheus metrics. [`uninstall`] takes all of it away again.
//!
//! Its own crate, on top of the plugin's library: the `flatnet` and
//! `flatnet-ipam` binaries never build its Kubernetes client, HTTP server
//! or metrics. What the plugin and the agent share about a network (its
//! lifecycle, the ready markers) is in `flatnet_datapath::node`.

pub mod config;
pub mod cri;
pub mod error;
pub mod file_source;
pub mod install;
pub mod kube_source;
pub mod metrics;
pub mod peers;
pub mod policy;
pub mod policy_sync;
pub mod policy_watch;
pub mod reclaim;
pub mod records_watch;
pub mod routes;
pub mod run;
pub mod service_sync;
pub mod services;
pub mod uninstall;

#[cfg(test)]
mod manifests;

pub use run::run;
pub use uninstall::uninstall;

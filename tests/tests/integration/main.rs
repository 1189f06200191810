//! flatnet's integration tests, one binary: built and linked once. Each
//! module is a file of tests (what each proves: docs/testing.md); files run
//! one after another, a file's tests side by side (`flatnet_tests::gate`),
//! as when each file was a binary of its own. They run as root against the
//! real kernel and call the built binaries as a runtime does; what a test
//! needs is stated on it (`#[flatnet_test(root, tools = [..])]`).

mod bigtcp;
mod chaining;
mod cluster;
mod concurrency;
mod cri;
mod datapath;
mod fresh_node;
mod host_ports;
mod hostile;
mod ipam;
mod lifecycle;
mod map_sizes;
mod masquerade;
mod modes;
mod monitor;
mod netpol;
mod nodeport;
mod nodeport_local;
mod overlay;
mod podman;
mod policy_latency;
mod policy_peers;
mod programs;
mod protocol;
mod reclaim;
mod services;
mod signals;
mod socket_lb;
mod spec;
mod tcx;
mod tcx_move;

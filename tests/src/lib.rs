//! Test harness: the plugins called like a runtime calls them, a per-test
//! network with its own name, subnet, gateway device and IPAM dir, pods,
//! traffic, and the simulated cluster. What xtask needs as well (network
//! namespaces, CNI calls, configuration lists, `unique`, `wait_until`, the
//! rule for a test that cannot run) is the `flatnet-harness` crate,
//! re-exported here whole.

use std::path::PathBuf;

pub mod cgroup;
pub mod cluster;
/// A real containerd with its CRI plugin, and the test images it runs.
pub mod containerd;
/// A CRI client: what kubelet sends containerd.
pub mod cri;
/// The node's forwarding switches, off as on a fresh machine.
pub mod forwarding;
/// Ethernet frames built byte by byte for the programs (BPF_PROG_TEST_RUN),
/// as Cilium's bpf/tests build theirs (pktgen.h).
pub mod frames;
/// Plugin binaries older than their sources are refused.
pub mod fresh;
/// One test binary, one file's tests at a time.
pub mod gate;
/// A stub of the Kubernetes API server: list and watch of the objects the
/// agent follows.
pub mod kube_stub;
/// Where a datagram died: each namespace's counters on its path.
pub mod path_report;
/// The scale harness's synthetic cluster, churn and measurements.
pub mod scale;
/// The datapath's programs run on crafted frames (BPF_PROG_TEST_RUN).
pub mod test_run;

// The harness's own types and helpers, re-exported below at the crate root.
mod early_panics;
mod ipam_net;
mod links;
mod list_attachment;
mod network;
mod outside_host;
mod requirements;
mod tc_hooks;
mod traffic;

pub use flatnet_harness::*;
pub use flatnet_test_macros::flatnet_test;
pub use ipam_net::IpamNet;
/// kube-proxy's Service rules (its own crate: the benchmark uses it too).
pub use kube_proxy_fixture as kube_proxy;
pub use links::{forwarded_datagrams, link_exists, link_packets, wait_link_gone};
pub use list_attachment::ListAttachment;
pub use network::{Network, Pod};
pub use outside_host::OutsideHost;
pub use requirements::{Needed, reference_plugins, requirements, tool_exists};
pub use tc_hooks::{TcHook, bpftool_ok, tc_hooks, wait_for_tcx};
pub use traffic::{
    ExchangeServer, in_ns, stream_during, tcp_echo, tcp_echo_via, tcp_source, udp_source,
};

/// Where the built binaries are (FLATNET_BIN_DIR, which xtask sets, or
/// target/debug), checked to be newer than their sources on first use.
#[track_caller]
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo xtask test`",
        path.display()
    );
    if let Err(stale) = fresh::check(name, &path) {
        panic!("{stale}");
    }
    path
}

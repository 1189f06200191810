//! What a bench round measured, path by path: the data-plane numbers,
//! the CNI timings and the flatnet program's variants.

use std::collections::BTreeMap;

use super::control::CniTimes;

/// One path's data-plane numbers in one round (NaN: not measured there).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DataSample {
    pub tcp_gbps: f64,
    pub rr_p50_us: f64,
    pub rr_p99_us: f64,
    pub udp_kpps: f64,
    /// TCP round trip p50 through a kube-proxy ClusterIP (bridge, flatnet).
    pub clusterip_rr_p50_us: f64,
    /// The datapath program's run time per packet during the UDP flood,
    /// from the kernel's BPF statistics (flatnet, flatnet-xdp).
    pub program_ns: f64,
    /// The same during the TCP stream (packets of up to 64 KiB: GSO).
    pub program_tcp_ns: f64,
    /// The same during ClusterIP round trips (the path's own network).
    pub clusterip_program_ns: f64,
    /// What BPF statistics charge a program that does nothing, in the same
    /// UDP flood: `pod_xdp_pass` on the receiving pod's veth (flatnet-xdp).
    pub program_floor_ns: f64,
}

/// Everything measured in one round.
#[derive(Debug, Default)]
pub struct Round {
    pub data: BTreeMap<&'static str, DataSample>,
    pub cni: BTreeMap<&'static str, CniTimes>,
    /// The flatnet pair's program variants (`variants`), by name.
    pub variants: BTreeMap<String, VariantSample>,
}

/// One variant's numbers in one round (NaN: not measured).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct VariantSample {
    /// ns per run of the variant during the 64 B UDP flood.
    pub udp_ns: f64,
    pub udp_kpps: f64,
    /// ns per run during the TCP stream.
    pub tcp_ns: f64,
    pub tcp_gbps: f64,
    /// Instructions the verifier kept of it (its untaken variants pruned).
    pub instructions: f64,
}

//! `cargo xtask e2e`'s flags: which suites, which Services modes, which
//! Kubernetes release, the cluster's shape, and what to keep.

use super::build;
use super::cluster::ServicesMode;

#[derive(clap::Args, Clone)]
pub struct E2eArgs {
    /// Every sig-network and NetworkPolicy spec this cluster can run (the
    /// default is the subset CI runs).
    #[arg(long)]
    pub full: bool,
    /// Which Services modes to run, comma-separated or repeated (default:
    /// each of them).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub services: Vec<ServicesMode>,
    /// Run only the specs matching this regular expression (ginkgo focus),
    /// instead of the suites.
    #[arg(long)]
    pub focus: Option<String>,
    /// The Kubernetes release (major.minor.patch), built from its Go modules.
    #[arg(long, default_value = build::DEFAULT_RELEASE)]
    pub kubernetes: build::Release,
    /// IPv4 and IPv6 (IPv4 first): node addresses, pod CIDRs and Service
    /// ranges of both families, and the `[Feature:IPv6DualStack]` specs.
    #[arg(long)]
    pub dual_stack: bool,
    /// Nodes of the cluster.
    #[arg(long, default_value_t = 2)]
    pub nodes: u8,
    /// Leave the cluster running after the suites (until Enter is pressed).
    #[arg(long)]
    pub keep: bool,
    /// Deploy the debug build (what `cargo xtask test` has just built and
    /// tested) instead of the release build users deploy.
    #[arg(long)]
    pub debug_build: bool,
    /// Only take away what an interrupted run left on this machine (its
    /// machines, the uplink guard, the global settings it changed), and exit.
    #[arg(long)]
    pub clean_up: bool,
}

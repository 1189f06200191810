//! The two plain types flatnet's configuration names from the kernel
//! layer: how pods are switched, and what the bandwidth plugin shapes.
//! Nothing else here: the fuzz build (tests/fuzz) compiles this file on its
//! own beside the configuration parser.

use serde::Deserialize;

/// How packets between local pods are switched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DatapathMode {
    /// tc ingress on the host veth, `bpf_redirect_peer` into the destination pod.
    #[default]
    Tc,
    /// XDP on the host veth, `bpf_redirect` into the destination's host veth.
    Xdp,
}

impl DatapathMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DatapathMode::Tc => "tc",
            DatapathMode::Xdp => "xdp",
        }
    }
}

/// The directions of a pod's traffic that qdiscs on its host veth shape
/// (the bandwidth plugin chained after flatnet). The fast path leaves such
/// traffic to the stack, which runs the qdiscs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shaping {
    /// Into the pod (a tbf on the host veth's egress).
    pub ingress: bool,
    /// Out of the pod (an `ingress` qdisc on the host veth, redirecting to
    /// an ifb device with a tbf).
    pub egress: bool,
}

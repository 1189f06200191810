//! flatnet's kernel layer, shared by the plugin and the agent: the eBPF
//! datapath (`bpf`: the object, its maps and attachments), rtnetlink objects
//! (`netlink`: links, addresses, routes, neighbours, qdiscs, sysctls),
//! network namespaces (`netns`), the node's locks (`lock`), masquerade
//! rules (`masquerade`), and a network's life on a node (`node`: loading
//! the datapath on first use, rebuilding it, releasing it when empty).
//!
//! It knows nothing of CNI: its [`Error`] keeps the underlying errors as
//! sources, and the plugin maps them to CNI codes at the verb boundary.

pub mod bpf;
pub mod error;
pub mod lock;
pub mod masquerade;
pub mod netlink;
pub mod netns;
pub mod node;
pub mod trace;
pub mod util;

pub use error::{Error, Result};

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

//! What a network is on a node beyond one pod: its lifecycle (datapath
//! loaded, programs attached, torn down with the last pod), the rebuild of
//! a wiped datapath, and the markers flatnet-agent leaves for the plugin.
//! The plugin's verbs, `flatnet repair` and flatnet-agent all use it; it
//! uses none of them.

pub mod first_packet;
pub mod lifecycle;
pub mod markers;
pub mod rebuild;

pub use lifecycle::{ensure_datapath, reattach_all, release_if_empty, remove_unused};

use std::path::PathBuf;

use crate::DatapathMode;

/// What the node layer needs to know of a network: the part of its
/// configuration that decides what exists on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNetwork {
    pub name: String,
    /// The device pods route through (`bridge` in the configuration).
    pub gateway_device: String,
    pub mode: DatapathMode,
    /// Whether masquerade rules may exist for the network.
    pub ip_masq: bool,
    /// Where the datapath is pinned, when not the default.
    pub pin_root: Option<PathBuf>,
    /// How the maps sized per node are made.
    pub map_sizing: crate::bpf::sizes::MapSizing,
}

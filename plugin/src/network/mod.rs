//! What a network is on a node beyond one pod: its lifecycle (datapath
//! loaded, programs attached, torn down with the last pod), the rebuild of
//! a wiped datapath, and the markers flatnet-agent leaves for the plugin.
//! The verbs (`cmd`), `flatnet repair` (`cli`) and flatnet-agent all use it;
//! it uses none of them.

pub mod first_packet;
pub mod lifecycle;
pub mod markers;
pub mod rebuild;

pub use lifecycle::{ensure_datapath, reattach_all, release_if_empty, remove_unused};

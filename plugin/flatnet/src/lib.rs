//! flatnet: a CNI plugin whose datapath is eBPF instead of a Linux bridge.
//!
//! This crate is the plugin itself: its configuration (`config`), one
//! handler per CNI verb (`verbs`, ADD planned before it is applied), the
//! IPAM delegation (`delegate`), the work done after the answer is out
//! (`after_answer`), the verb boundary where kernel errors get their CNI
//! codes (`error`), and the operator's CLI (`cli`: inspect, monitor,
//! repair). The CNI protocol is in `flatnet-cni`, the kernel layer in
//! `flatnet-datapath`, the IPAM plugin in `flatnet-ipam`.

pub mod after_answer;
pub mod cli;
pub mod config;
pub mod delegate;
pub mod dispatch;
pub mod error;
mod network;
pub mod verbs;

pub use error::{Error, Result};
pub use flatnet_datapath::bpf::sizes as map_sizing;
pub use flatnet_datapath::{DatapathMode, Shaping};

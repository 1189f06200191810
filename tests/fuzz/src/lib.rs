//! flatnet's parsers of untrusted input, built on their own for fuzzing:
//! flatnet-cni and flatnet-ipam as they are (crates without the kernel
//! layer), and the plugin's own configuration parser, compiled from its
//! source file (plugin/flatnet/src/config.rs) with the two plain datapath
//! types it names (plugin/datapath/src/mode.rs) and the map sizing
//! (plugin/datapath/src/bpf/sizes.rs, over flatnet-common's map specs),
//! not copies: the rest of those crates (aya, rtnetlink, tokio, the eBPF
//! object) stays out of the sanitizer build. A fuzz build that fails on a new `crate::` path says
//! the parser grew a dependency.
#![allow(dead_code, unused_imports)]

#[path = "../../../plugin/datapath/src/mode.rs"]
mod mode;
pub use mode::{DatapathMode, Shaping};

#[path = "../../../plugin/datapath/src/bpf/sizes.rs"]
mod map_sizing;

#[path = "../../../plugin/flatnet/src/config.rs"]
pub mod config;

//! flatnet's parsers of untrusted input, built on their own for fuzzing:
//! the plugin's own source files (plugin/src/cni, plugin/src/ipam/config.rs
//! and allocator.rs), not copies, without the kernel-facing rest of the
//! crate (aya, rtnetlink, tokio, the node agent), so the sanitizer build
//! stays small. Those files must only reach into each other: a fuzz build
//! that fails on a new `crate::` path says one of them grew a dependency.
#![allow(dead_code, unused_imports)]

#[path = "../../../plugin/src/cni/mod.rs"]
pub mod cni;
pub mod ipam;

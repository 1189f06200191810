//! flatnet-ipam's configuration parser and the address plan it builds.

#[path = "../../../plugin/src/ipam/allocator.rs"]
pub mod allocator;
#[path = "../../../plugin/src/ipam/config.rs"]
pub mod config;

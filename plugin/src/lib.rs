//! flatnet: a CNI plugin whose datapath is eBPF instead of a Linux bridge.
//!
//! The binaries in `src/bin` are thin; this library holds the CNI protocol
//! (`cni`), kernel plumbing (`netns`, `link`, `datapath`), delegation to the
//! IPAM plugin (`delegate`), and one handler per verb (`cmd`).

pub mod cmd;
pub mod cni;
pub mod datapath;
pub mod delegate;
pub mod link;
pub mod lock;
pub mod netns;
pub mod reaper;
pub mod runner;
pub mod trace;

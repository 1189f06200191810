//! flatnet: a CNI plugin whose datapath is eBPF instead of a Linux bridge.
//!
//! The binaries in `src/bin` are thin; this library holds the CNI protocol
//! (`cni`), kernel plumbing (`netns`, `link`, `datapath`), delegation to the
//! IPAM plugin (`delegate`), one handler per verb (`cmd`), and the
//! flatnet-ipam plugin (`ipam`); `runner` runs either binary.

pub mod cli;
pub mod cmd;
pub mod cni;
pub mod datapath;
pub mod delegate;
pub mod inspect;
pub mod inspect_services;
pub mod ipam;

pub mod lock;
pub mod masq;
pub mod monitor;
pub mod net;
pub mod netns;
pub mod network;
pub mod reaper;
pub mod runner;
pub mod trace;
pub mod util;

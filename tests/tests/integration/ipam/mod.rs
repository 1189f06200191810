//! flatnet-ipam as a runtime (or a delegating plugin) drives it: env + stdin
//! in, JSON out, the store on disk read back. Concurrency and SIGKILL
//! torture, the protocol's corners, and interop with the reference bridge
//! plugin and with flatnet.
//!
//! The tests by what they prove: `store` (concurrency, SIGKILL, corrupted
//! files), `allocation` (what an ADD gets), `protocol` (configs, CHECK, GC,
//! STATUS, VERSION) and `interop` (behind bridge and flatnet). Their shared
//! helpers are in `fixture`.

mod fixture;

mod allocation;
mod interop;
mod protocol;
mod store;

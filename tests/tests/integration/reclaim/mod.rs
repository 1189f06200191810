//! Leak-proof addresses under a real runtime: a simulated node (its own
//! network namespace on the cluster harness's underlay) runs the real
//! flatnet-agent with `--cri-socket` and a real containerd 1.6 (CRI plugin)
//! in the same namespace, on the conflist the agent wrote. containerd never
//! runs CNI GC; the agent's reclaim loop must give back what a DEL that
//! never came left behind, and never touch a live sandbox's address.
//!
//! - An attachment no runtime knows (a plain ADD, as `ctr run --cni` makes,
//!   whose netns then vanished): still held at half the grace period,
//!   released within a few resyncs after it, datapath entry gone.
//! - containerd SIGKILLed in the middle of an ADD (the plugin stopped at
//!   its last stage with FLATNET_STOP_AFTER, then killed too): containerd
//!   still lists the half-made sandbox after its restart, so the loop keeps
//!   it and the runtime's Stop+Remove releases it; when the runtime loses its
//!   record of such a sandbox, the loop releases address, host veth and
//!   datapath entry after the grace period.
//! - 32 live sandboxes, sandboxes started and removed around them, 500
//!   reclaim passes: nothing reclaimed, every live address still held, the
//!   pods still talk.
//!
//! The tests by what they prove: `missing_del`, `runtime_killed` and
//! `live_sandboxes`. Their node and helpers are in `fixture`.

mod fixture;

mod live_sandboxes;
mod missing_del;
mod runtime_killed;

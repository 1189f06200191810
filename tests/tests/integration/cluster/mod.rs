//! Cross-node behaviour on a simulated cluster (the harness is
//! `flatnet_tests::cluster`): the fast path between nodes, the agent's peer
//! sources, fallbacks, restarts, ipMasq, uninstall, dual-stack and XDP.
//!
//! The tests by what they prove: `fast_path` (pods across nodes, the
//! fallback to the stack, ipMasq), `node_settings` (dual-stack, XDP mode,
//! uplink and MTU), `peers` (the peer file and foreign routes),
//! `agent_lifecycle` (uninstall, restarts, other builds, a moved pin root)
//! `kubernetes` (the agent against the API stub) and `policy_upgrade` (an
//! upgrade to policy by peer identity under traffic). What they read off
//! a node is in `fixture`.

mod fixture;

mod agent_lifecycle;
mod fast_path;
mod kubernetes;
mod node_settings;
mod peers;
mod policy_upgrade;

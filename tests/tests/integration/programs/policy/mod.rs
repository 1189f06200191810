//! NetworkPolicy in the programs, and its drop events.
//!
//! The cases by what they prove: `tables` (what a pod's tables allow and
//! drop), `recorded_flows` (replies and errors of recorded flows, policy
//! changes) and `events` (drop events). What they write and read is in
//! `fixture`.

mod fixture;

mod events;
mod identities;
mod recorded_flows;
mod tables;

// The rules other sections write too (xdp.rs), through programs' glob
// import of this section.
pub(super) use fixture::{rule, tcp_port};

//! The cluster administrator's tiers around NetworkPolicy:
//! ClusterNetworkPolicy (`policy.networking.k8s.io`), its Admin tier judged
//! before NetworkPolicy and its Baseline tier after it.
//!
//! [`cluster_network_policy`] reads the API's objects into the agent's own
//! form; [`judge`] is the evaluation order the API defines, per connection:
//! the model the datapath's tables are checked against.

pub mod cluster_network_policy;
pub mod judge;
pub mod paint;

#[cfg(test)]
mod tests;

pub use cluster_network_policy::{
    Action, ClusterNetworkPolicy, NamespacedPods, Peer, Ports, Rule, Subject, Tier,
    WatchedClusterNetworkPolicy,
};
pub use judge::{DecidedBy, Decision, Remote, Traffic, Workload, judge};

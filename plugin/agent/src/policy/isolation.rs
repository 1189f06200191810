//! Which directions each namespace's NetworkPolicies isolate, for ADD's
//! first packet: kept per policy, so one policy's change updates it
//! without every policy of the cluster read again.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::networking::v1::NetworkPolicy;

use flatnet_datapath::node::first_packet::{Directions, Isolation};

use super::rules;

/// [`super::isolation`], kept per policy: one policy's change updates it without
/// reading every policy of the cluster again.
#[derive(Debug, Default)]
pub struct IsolationByPolicy {
    /// Each isolating policy's (ingress, egress), by namespace and name.
    types: HashMap<(String, String), (bool, bool)>,
    /// Per namespace, how many of its policies isolate each direction.
    counts: BTreeMap<String, (usize, usize)>,
}

impl IsolationByPolicy {
    pub fn of(policies: &[&NetworkPolicy]) -> Self {
        let mut by_policy = IsolationByPolicy::default();
        for policy in policies {
            let key = (
                policy.metadata.namespace.clone().unwrap_or_default(),
                policy.metadata.name.clone().unwrap_or_default(),
            );
            by_policy.set(key, Some(policy));
        }
        by_policy
    }

    /// Policy `key` is now `policy` (None: deleted).
    pub fn set(&mut self, key: (String, String), policy: Option<&NetworkPolicy>) {
        let now = policy
            .filter(|p| p.metadata.namespace.is_some())
            .map(rules::policy_types)
            .filter(|(ingress, egress)| *ingress || *egress);
        let before = match now {
            Some(types) => self.types.insert(key.clone(), types),
            None => self.types.remove(&key),
        };
        let counts = self.counts.entry(key.0.clone()).or_default();
        for (types, add) in [(before, false), (now, true)] {
            let Some((ingress, egress)) = types else {
                continue;
            };
            let step = |n: &mut usize, on: bool| match (on, add) {
                (false, _) => {}
                (true, true) => *n += 1,
                (true, false) => *n = n.saturating_sub(1),
            };
            step(&mut counts.0, ingress);
            step(&mut counts.1, egress);
        }
        if *counts == (0, 0) {
            self.counts.remove(&key.0);
        }
    }

    pub fn isolation(&self) -> Isolation {
        let namespaces = self.counts.iter().map(|(namespace, (ingress, egress))| {
            let directions = Directions {
                ingress: *ingress > 0,
                egress: *egress > 0,
            };
            (namespace.clone(), directions)
        });
        Isolation {
            listed: true,
            namespaces: namespaces.collect(),
        }
    }
}

//! Which directions each namespace's NetworkPolicies isolate, for ADD's
//! first packet: kept per policy, so one policy's change updates it
//! without every policy of the cluster read again.

use std::collections::{BTreeMap, HashMap};

use super::network_policy::NetworkPolicy;

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
            let key = (policy.namespace.to_string(), policy.name.to_string());
            by_policy.set(key, Some(policy));
        }
        by_policy
    }

    /// Policy `key` is now `policy` (None: deleted). Whether its
    /// namespace's isolation changed.
    pub fn set(&mut self, key: (String, String), policy: Option<&NetworkPolicy>) -> bool {
        let now = policy
            .filter(|p| !p.namespace.is_empty())
            .map(rules::policy_types)
            .filter(|(ingress, egress)| *ingress || *egress);
        let before = match now {
            Some(types) => self.types.insert(key.clone(), types),
            None => self.types.remove(&key),
        };
        let counts = self.counts.entry(key.0.clone()).or_default();
        let isolates = |(ingress, egress): (usize, usize)| (ingress > 0, egress > 0);
        let was = isolates(*counts);
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
        let changed = isolates(*counts) != was;
        if *counts == (0, 0) {
            self.counts.remove(&key.0);
        }
        changed
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

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, types: &[&str]) -> NetworkPolicy {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "x", "name": name},
            "spec": {"podSelector": {}, "policyTypes": types}
        }))
        .unwrap()
    }

    #[test]
    fn a_policy_says_whether_its_namespaces_isolation_changed() {
        let mut by_policy = IsolationByPolicy::default();
        let key = |name: &str| ("x".to_string(), name.to_string());
        assert!(by_policy.set(key("a"), Some(&policy("a", &["Ingress"]))));
        // A second policy of the same direction changes nothing for ADD.
        assert!(!by_policy.set(key("b"), Some(&policy("b", &["Ingress"]))));
        assert!(by_policy.set(key("b"), Some(&policy("b", &["Ingress", "Egress"]))));
        assert!(!by_policy.set(key("a"), None));
        assert!(by_policy.set(key("b"), None));
        assert_eq!(by_policy.isolation().namespaces.len(), 0);
    }
}

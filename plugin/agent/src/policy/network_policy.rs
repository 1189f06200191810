//! NetworkPolicies (networking.k8s.io/v1) as the agent keeps them. The
//! fields the policy computation reads, under the API's names; label
//! selectors shared: equal selectors (every namespace's `podSelector: {}`,
//! the `app: x` a Deployment's policies repeat) are one copy. k8s-openapi's
//! types keep each selector's labels in a B-tree of its own and the whole
//! `ObjectMeta`: at the scale harness's xl size (30,000 policies) a policy
//! cost 2.2 KiB in kube's store.
//!
//! kube's watcher decodes a [`WatchedNetworkPolicy`], which carries the
//! resourceVersion it resumes from; the agent's store
//! (`object_store`) keeps the [`NetworkPolicy`] inside.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::networking::v1 as api;
pub use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use serde::Deserialize;

use super::object_store::{Named, Watched};
use crate::interned::Interner;
use crate::metrics::latency::TRIGGER_TIME;
use crate::slim::watched_as;

static SELECTORS: LazyLock<Interner<Selector>> = LazyLock::new(Interner::new);

/// A label selector (`metav1.LabelSelector`), shared with every equal one.
pub type LabelSelector = Arc<Selector>;

/// A label selector's terms.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    pub match_labels: Option<BTreeMap<String, String>>,
    pub match_expressions: Option<Vec<Requirement>>,
}

/// One `matchExpressions` term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    pub values: Option<Vec<String>>,
}

/// A NetworkPolicy: what its rules and selectors say, its name, and the
/// change's trigger time (the latency metrics read it).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "api::NetworkPolicy")]
pub struct NetworkPolicy {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub trigger_time: Option<Box<str>>,
    pub spec: Option<NetworkPolicySpec>,
}

#[derive(Clone, Debug)]
pub struct NetworkPolicySpec {
    /// None selects every pod of the namespace, as the empty selector does.
    pub pod_selector: Option<LabelSelector>,
    pub ingress: Option<Box<[NetworkPolicyIngressRule]>>,
    pub egress: Option<Box<[NetworkPolicyEgressRule]>>,
    pub policy_types: Option<Box<[PolicyType]>>,
}

/// A `policyTypes` item; one the API server would reject is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyType {
    Ingress,
    Egress,
    Other,
}

#[derive(Clone, Debug)]
pub struct NetworkPolicyIngressRule {
    pub from: Option<Box<[NetworkPolicyPeer]>>,
    pub ports: Option<Box<[NetworkPolicyPort]>>,
}

#[derive(Clone, Debug)]
pub struct NetworkPolicyEgressRule {
    pub to: Option<Box<[NetworkPolicyPeer]>>,
    pub ports: Option<Box<[NetworkPolicyPort]>>,
}

#[derive(Clone, Debug)]
pub struct NetworkPolicyPeer {
    pub pod_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
    pub ip_block: Option<Box<IPBlock>>,
}

/// A NetworkPolicy as kube's watcher decodes it: the policy, and the
/// metadata the watcher reads (the resourceVersion it resumes from).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "api::NetworkPolicy")]
pub struct WatchedNetworkPolicy {
    pub metadata: meta::ObjectMeta,
    pub policy: NetworkPolicy,
}

impl From<api::NetworkPolicy> for WatchedNetworkPolicy {
    fn from(served: api::NetworkPolicy) -> Self {
        let metadata = meta::ObjectMeta {
            name: served.metadata.name.clone(),
            namespace: served.metadata.namespace.clone(),
            resource_version: served.metadata.resource_version.clone(),
            ..meta::ObjectMeta::default()
        };
        WatchedNetworkPolicy {
            metadata,
            policy: NetworkPolicy::from(served),
        }
    }
}

impl From<WatchedNetworkPolicy> for NetworkPolicy {
    fn from(watched: WatchedNetworkPolicy) -> Self {
        watched.policy
    }
}

impl From<api::NetworkPolicy> for NetworkPolicy {
    fn from(served: api::NetworkPolicy) -> Self {
        let meta = served.metadata;
        let trigger_time = meta
            .annotations
            .and_then(|mut a| a.remove(TRIGGER_TIME))
            .map(String::into_boxed_str);
        NetworkPolicy {
            namespace: crate::interned::name(meta.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(meta.name.unwrap_or_default()),
            trigger_time,
            spec: served.spec.map(spec),
        }
    }
}

fn spec(served: api::NetworkPolicySpec) -> NetworkPolicySpec {
    NetworkPolicySpec {
        pod_selector: served.pod_selector.map(shared_selector),
        ingress: served.ingress.map(|rules| {
            rules
                .into_iter()
                .map(|rule| NetworkPolicyIngressRule {
                    from: rule.from.map(peers),
                    ports: rule.ports.map(Vec::into_boxed_slice),
                })
                .collect()
        }),
        egress: served.egress.map(|rules| {
            rules
                .into_iter()
                .map(|rule| NetworkPolicyEgressRule {
                    to: rule.to.map(peers),
                    ports: rule.ports.map(Vec::into_boxed_slice),
                })
                .collect()
        }),
        policy_types: served.policy_types.map(|types| {
            types
                .iter()
                .map(|t| match t.as_str() {
                    "Ingress" => PolicyType::Ingress,
                    "Egress" => PolicyType::Egress,
                    _ => PolicyType::Other,
                })
                .collect()
        }),
    }
}

fn peers(served: Vec<api::NetworkPolicyPeer>) -> Box<[NetworkPolicyPeer]> {
    served
        .into_iter()
        .map(|peer| NetworkPolicyPeer {
            pod_selector: peer.pod_selector.map(shared_selector),
            namespace_selector: peer.namespace_selector.map(shared_selector),
            ip_block: peer.ip_block.map(Box::new),
        })
        .collect()
}

/// The shared copy of a selector.
pub(crate) fn shared_selector(served: meta::LabelSelector) -> LabelSelector {
    let selector = Selector {
        match_labels: served.match_labels,
        match_expressions: served.match_expressions.map(|terms| {
            terms
                .into_iter()
                .map(|t| Requirement {
                    key: t.key,
                    operator: t.operator,
                    values: t.values,
                })
                .collect()
        }),
    };
    SELECTORS.get(&selector, || Arc::new(selector.clone()))
}

impl Named for NetworkPolicy {
    fn namespace(&self) -> &Arc<str> {
        &self.namespace
    }

    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn trigger_time(&self) -> Option<&str> {
        self.trigger_time.as_deref()
    }
}

impl Watched for WatchedNetworkPolicy {
    type Object = NetworkPolicy;

    fn object(&self) -> &NetworkPolicy {
        &self.policy
    }
}

watched_as!(
    WatchedNetworkPolicy,
    k8s_openapi::api::networking::v1::NetworkPolicy
);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn what_the_api_serves_is_kept_under_its_names() {
        let served = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "1", "resourceVersion": "42",
                "annotations": {
                    TRIGGER_TIME: "2026-01-01T00:00:00Z",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]
            },
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress", "Egress", "Sideways"],
                "ingress": [{
                    "from": [
                        {"namespaceSelector": {"matchExpressions": [
                            {"key": "env", "operator": "In", "values": ["prod"]}]},
                         "podSelector": {}},
                        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}
                    ],
                    "ports": [{"port": "http"}, {"port": 80, "endPort": 90, "protocol": "UDP"}]
                }],
                "egress": [{"to": []}]
            }
        });
        let watched: WatchedNetworkPolicy = serde_json::from_value(served).unwrap();
        assert_eq!(watched.metadata.resource_version.as_deref(), Some("42"));
        assert!(watched.metadata.annotations.is_none());
        let policy = watched.policy;
        assert_eq!((&*policy.namespace, &*policy.name), ("shop", "web"));
        assert_eq!(policy.trigger_time.as_deref(), Some("2026-01-01T00:00:00Z"));
        let spec = policy.spec.unwrap();
        let app = spec.pod_selector.unwrap();
        assert_eq!(app.match_labels.as_ref().unwrap()["app"], "web");
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&[PolicyType::Ingress, PolicyType::Egress, PolicyType::Other][..])
        );
        let rule = &spec.ingress.unwrap()[0];
        let from = rule.from.as_deref().unwrap();
        let env = from[0].namespace_selector.as_ref().unwrap();
        assert_eq!(
            env.match_expressions.as_ref().unwrap()[0].values,
            Some(vec!["prod".into()])
        );
        assert_eq!(from[0].pod_selector.as_deref(), Some(&Selector::default()));
        assert_eq!(from[1].ip_block.as_ref().unwrap().cidr, "10.0.0.0/8");
        assert_eq!(rule.ports.as_ref().unwrap()[1].end_port, Some(90));
        assert_eq!(
            spec.egress.unwrap()[0].to.as_deref().map(<[_]>::len),
            Some(0)
        );
    }

    #[test]
    fn equal_selectors_are_one_copy() {
        let policy = |name: &str, app: &str| -> NetworkPolicy {
            serde_json::from_value(json!({
                "metadata": {"namespace": "x", "name": name},
                "spec": {"podSelector": {"matchLabels": {"app": app}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": app}}}]}]}
            }))
            .unwrap()
        };
        let selected = |p: &NetworkPolicy| p.spec.as_ref().unwrap().pod_selector.clone().unwrap();
        let (a, b, c) = (policy("a", "web"), policy("b", "web"), policy("c", "db"));
        assert!(Arc::ptr_eq(&selected(&a), &selected(&b)));
        assert!(!Arc::ptr_eq(&selected(&a), &selected(&c)));
        let peer = a.spec.as_ref().unwrap().ingress.as_ref().unwrap()[0]
            .from
            .as_ref()
            .unwrap()[0]
            .pod_selector
            .clone()
            .unwrap();
        assert!(Arc::ptr_eq(&selected(&a), &peer));
    }
}

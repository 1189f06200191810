//! Churn as Cilium's CI makes it (its `policy-churn` module): pods and
//! NetworkPolicies of the synthetic cluster deleted and created again, one
//! change at a time, pods and policies in turn. A pod behind a Service
//! takes its EndpointSlice along (rewritten with the pods still there and
//! a new trigger time), as the EndpointSlice controller would. Pure: the
//! writes to make, in order; the harness makes them at its rate.

use std::collections::BTreeSet;

use serde_json::Value;

use super::objects::{self, REPLICAS, Size};
use crate::kube_stub::Kind;

/// One write to the API server.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Create (or replace) this object.
    Put(Kind, Value),
    /// Delete the object of this key (`namespace/name`).
    Delete(Kind, String),
}

impl Write {
    pub fn kind(&self) -> Kind {
        match self {
            Write::Put(kind, _) | Write::Delete(kind, _) => *kind,
        }
    }
}

/// Strides through the pods and policies: primes, so that consecutive
/// changes land on different nodes, namespaces and Services.
const POD_STRIDE: usize = 7_919;
const POLICY_STRIDE: usize = 7_907;

/// What the churn has changed so far.
pub struct Churn {
    size: Size,
    step: usize,
    gone_pods: BTreeSet<usize>,
    gone_policies: BTreeSet<usize>,
}

impl Churn {
    pub fn new(size: Size) -> Self {
        Churn {
            size,
            step: 0,
            gone_pods: BTreeSet::new(),
            gone_policies: BTreeSet::new(),
        }
    }

    /// The writes of the next change (a pod's, then a policy's, in turn);
    /// `trigger` is now, for a slice it rewrites.
    pub fn next_change(&mut self, trigger: &str) -> Vec<Write> {
        let step = self.step;
        self.step += 1;
        if step.is_multiple_of(2) {
            self.pod_change(step / 2, trigger)
        } else {
            self.policy_change(step / 2)
        }
    }

    fn pod_change(&mut self, n: usize, trigger: &str) -> Vec<Write> {
        let size = self.size;
        let i = (n * POD_STRIDE) % size.pods;
        let pod = objects::pod(&size, i);
        let mut writes = vec![if self.gone_pods.remove(&i) {
            Write::Put(Kind::Pod, pod)
        } else {
            self.gone_pods.insert(i);
            Write::Delete(Kind::Pod, key_of(&pod))
        }];
        let service = i / REPLICAS;
        if service < size.services {
            let gone = &self.gone_pods;
            let slice = objects::endpoint_slice(&size, service, |p| !gone.contains(&p), trigger);
            writes.push(Write::Put(Kind::EndpointSlice, slice));
        }
        writes
    }

    fn policy_change(&mut self, n: usize) -> Vec<Write> {
        let size = self.size;
        let p = (n * POLICY_STRIDE) % size.policies;
        // Each time it comes back it names another port: a change the
        // tables of the pods it selects must show.
        let generation = (n / size.policies.max(1)) as u16;
        let policy = objects::policy(&size, p, generation);
        if self.gone_policies.remove(&p) {
            vec![Write::Put(Kind::NetworkPolicy, policy)]
        } else {
            self.gone_policies.insert(p);
            vec![Write::Delete(Kind::NetworkPolicy, key_of(&policy))]
        }
    }

    /// Pod and policy changes made so far.
    pub fn changes(&self) -> usize {
        self.step
    }
}

fn key_of(object: &Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_and_policies_take_turns_and_each_comes_back() {
        let size = objects::SIZES[0];
        let mut churn = Churn::new(size);
        let mut deleted = std::collections::BTreeMap::new();
        for _ in 0..4 * size.pods {
            for write in churn.next_change("2026-11-29T21:00:00Z") {
                match write {
                    Write::Delete(kind, key) => {
                        assert!(
                            deleted.insert((kind, key.clone()), ()).is_none(),
                            "{key} deleted twice"
                        );
                    }
                    Write::Put(kind, object) if kind != Kind::EndpointSlice => {
                        deleted.remove(&(kind, key_of(&object)));
                    }
                    Write::Put(..) => {}
                }
            }
        }
        assert_eq!(churn.changes(), 4 * size.pods);
        // Every pod and policy went twice and came back twice.
        assert!(deleted.is_empty(), "{} still deleted", deleted.len());
    }

    #[test]
    fn a_pod_behind_a_service_rewrites_its_slice_without_it() {
        let size = objects::SIZES[0];
        let mut churn = Churn::new(size);
        let writes = churn.next_change("2026-11-29T21:00:00Z");
        // Pod 0 (Service 0's first replica) goes, its slice with it.
        assert_eq!(
            writes[0],
            Write::Delete(Kind::Pod, key_of(&objects::pod(&size, 0)))
        );
        let Write::Put(Kind::EndpointSlice, slice) = &writes[1] else {
            panic!("{writes:?}")
        };
        assert_eq!(slice["endpoints"].as_array().unwrap().len(), REPLICAS - 1);
        assert_eq!(
            slice["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"],
            "2026-11-29T21:00:00Z"
        );
        assert_eq!(churn.next_change("t")[0].kind(), Kind::NetworkPolicy);
    }
}

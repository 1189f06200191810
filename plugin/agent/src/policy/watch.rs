//! What NetworkPolicy needs from the API server: every NetworkPolicy, Pod
//! and Namespace of the cluster (peers can be anywhere), every Service and
//! EndpointSlice (egress to a ClusterIP is judged by its backends), and the
//! ClusterNetworkPolicies where their CRDs are installed, each kept by its
//! own watcher (`kind_watch`: a re-list after a broken watch, backoff on
//! errors, as for Nodes): all but Namespaces in slim stores of the agent's
//! own (`object_store`). Nothing is computed here: each event bumps a
//! counter the agent's loop waits on, once every kind is listed, and each
//! change (not what a list brings) is stamped for the latency metrics
//! (`metrics::latency`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::services::{EndpointSlice, Service, WatchedEndpointSlice, WatchedService};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::Pod;
use super::changes::{
    CLUSTER_POLICY, Changed, ENDPOINT_SLICE, Key, NAMESPACE, POD, POLICY, SERVICE, SliceIndex,
};
pub use super::kind_watch::slim_for_store;
use super::kind_watch::{WatchedKind, own, reflected};
use super::network_policy::{NetworkPolicy, WatchedNetworkPolicy};
use super::object_store::ObjectStore;
use super::pod::{PodStore, WatchedPod};
use super::tiers::{ClusterNetworkPolicy, WatchedClusterNetworkPolicy};
use crate::metrics::AgentMetrics;
use crate::metrics::latency::{ChangeStamps, Taken};
use crate::watch_backoff::status_code;

/// A kind's name and the API version it is watched at.
const fn kind<K: k8s_openapi::Resource>() -> (&'static str, &'static str) {
    (K::KIND, K::API_VERSION)
}

/// The kinds, for log lines and readiness: every one but the optional
/// ones is served by each Kubernetes release flatnet supports
/// (EndpointSlice v1 since 1.21, NetworkPolicy v1 since 1.7), none
/// deprecated.
const KINDS: [(&str, &str); 6] = [
    kind::<WatchedNetworkPolicy>(),
    kind::<WatchedPod>(),
    kind::<Namespace>(),
    kind::<WatchedService>(),
    kind::<WatchedEndpointSlice>(),
    kind::<WatchedClusterNetworkPolicy>(),
];

/// Kinds of CRDs a cluster may not have installed: an API server that
/// does not serve them has none (listed, empty), which is not a problem.
const OPTIONAL: [usize; 1] = [CLUSTER_POLICY];

/// Kind `index` as its watch knows it.
fn watched(index: usize) -> WatchedKind {
    let (name, api_version) = KINDS[index];
    WatchedKind {
        index,
        name,
        api_version,
        optional: OPTIONAL.contains(&index),
    }
}

/// What the watches have seen so far.
#[derive(Clone)]
pub struct PolicyObjects {
    policies: ObjectStore<NetworkPolicy>,
    pods: PodStore,
    namespaces: Store<Namespace>,
    services: ObjectStore<Service>,
    slices: ObjectStore<EndpointSlice>,
    cluster_policies: ObjectStore<ClusterNetworkPolicy>,
    health: Arc<Mutex<Health>>,
    stamps: ChangeStamps,
    changed: Arc<Mutex<Changed>>,
    slice_index: Arc<Mutex<SliceIndex>>,
    /// Events seen per kind (lists included), counted after the store
    /// holds them: a pass can tell which kinds changed since an earlier one.
    event_counts: Arc<[AtomicU64; KINDS.len()]>,
}

/// Whether each kind has been listed, and its watch's last error since.
#[derive(Debug, Default)]
struct Health {
    listed: [bool; KINDS.len()],
    errors: [Option<String>; KINDS.len()],
}

impl Health {
    /// Why the objects cannot be trusted yet: each kind not listed, with
    /// the last error of its watch; None once all are listed.
    fn problem(&self) -> Option<String> {
        let missing: Vec<String> = KINDS
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.listed[*i])
            .map(|(i, (kind, api_version))| match &self.errors[i] {
                Some(error) => format!("{kind} ({api_version}) cannot be listed: {error}"),
                None => format!("{kind} ({api_version}) not listed yet"),
            })
            .collect();
        (!missing.is_empty()).then(|| missing.join("; "))
    }
}

/// A watch's error as readiness and the log say it. A 404 for the kind's
/// collection means the API server does not serve its API version
/// (discovery.k8s.io/v1 before Kubernetes 1.21, say): that is said before
/// the error itself.
fn describe(kind: usize, error: &watcher::Error) -> String {
    match status_code(error) {
        Some(404) => {
            let api_version = KINDS[kind].1;
            format!(
                "the API server does not serve {api_version} (every Kubernetes release flatnet supports, 1.35 and later, does): {error}"
            )
        }
        _ => error.to_string(),
    }
}

/// The objects as of now (shared with the stores, not copied).
pub struct Snapshot {
    pub policies: Vec<Arc<NetworkPolicy>>,
    pub pods: Vec<Arc<Pod>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<EndpointSlice>>,
    pub cluster_policies: Vec<Arc<ClusterNetworkPolicy>>,
}

impl PolicyObjects {
    /// Why the watched objects are incomplete (a kind not listed, and the
    /// error its watch last had); None once every kind is listed.
    pub fn problem(&self) -> Option<String> {
        self.health.lock().ok().and_then(|h| h.problem())
    }

    /// The changes stamped since the last call: taken before a pass reads
    /// the objects, observed once it has written them.
    pub fn take_changes(&self) -> Taken {
        self.stamps.take()
    }

    /// A number that grows whenever a Service or EndpointSlice event
    /// came: read before a snapshot, it says the snapshot holds them.
    pub fn services_generation(&self) -> u64 {
        self.event_counts[SERVICE].load(Ordering::Acquire)
            + self.event_counts[ENDPOINT_SLICE].load(Ordering::Acquire)
    }

    /// What changed since the last call (everything, before the first).
    pub fn take_changed(&self) -> Changed {
        self.changed
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or(Changed {
                whole: true,
                ..Changed::default()
            })
    }

    /// Pod `namespace/name` as the store holds it now.
    pub fn pod(&self, (namespace, name): &(String, String)) -> Option<Arc<Pod>> {
        self.pods.get(namespace, name)
    }

    /// Service `namespace/name` as the store holds it now.
    pub fn service(&self, (namespace, name): &(String, String)) -> Option<Arc<Service>> {
        self.services.get(namespace, name)
    }

    /// The EndpointSlices serving `services` (namespace, name) now.
    pub fn slices_of(&self, services: &BTreeSet<Key>) -> Vec<Arc<EndpointSlice>> {
        let Ok(index) = self.slice_index.lock() else {
            return Vec::new();
        };
        services
            .iter()
            .flat_map(|(namespace, service)| {
                let key = (namespace.clone(), service.clone());
                let names: Vec<String> = index.slices_of(&key).cloned().collect();
                names
                    .into_iter()
                    .filter_map(|name| self.slices.get(namespace, &name))
            })
            .collect()
    }

    /// NetworkPolicy `namespace/name` as the store holds it now.
    pub fn policy(&self, (namespace, name): &(String, String)) -> Option<Arc<NetworkPolicy>> {
        self.policies.get(namespace, name)
    }

    /// The Services and EndpointSlices as of now (the other kinds empty).
    pub fn service_snapshot(&self) -> Snapshot {
        Snapshot {
            policies: Vec::new(),
            pods: Vec::new(),
            namespaces: Vec::new(),
            services: self.services.state(),
            slices: self.slices.state(),
            cluster_policies: Vec::new(),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            policies: self.policies.state(),
            pods: self.pods.state(),
            namespaces: self.namespaces.state(),
            services: self.services.state(),
            slices: self.slices.state(),
            cluster_policies: self.cluster_policies.state(),
        }
    }
}

/// Starts the watches. The receiver's value changes after every
/// event once all five kinds have been listed (never before: a plan from
/// a partial view would isolate pods from peers not seen yet); its sender
/// closing means the watches ended.
pub fn spawn(
    client: Client,
    metrics: AgentMetrics,
    stamps: ChangeStamps,
) -> (PolicyObjects, watch::Receiver<u64>) {
    let changed = Arc::new(Mutex::new(Changed {
        whole: true,
        ..Changed::default()
    }));
    let slice_index = Arc::new(Mutex::new(SliceIndex::default()));
    let log = (&stamps, &changed, None);
    let (policies, policy_events) = own::<WatchedNetworkPolicy>(&client, watched(POLICY), log);
    let (pods, pod_events) = own::<WatchedPod>(&client, watched(POD), log);
    let (namespaces, namespace_events) = reflected::<Namespace>(&client, watched(NAMESPACE), log);
    let (services, service_events) = own::<WatchedService>(&client, watched(SERVICE), log);
    let log = (&stamps, &changed, Some(&slice_index));
    let (slices, slice_events) = own::<WatchedEndpointSlice>(&client, watched(ENDPOINT_SLICE), log);
    let log = (&stamps, &changed, None);
    let (cluster_policies, cluster_policy_events) =
        own::<WatchedClusterNetworkPolicy>(&client, watched(CLUSTER_POLICY), log);
    let health = Arc::new(Mutex::new(Health::default()));
    let mut events = futures::stream::select_all([
        policy_events,
        pod_events,
        namespace_events,
        service_events,
        slice_events,
        cluster_policy_events,
    ]);
    let (changes, receiver) = watch::channel(0u64);
    let watched_health = health.clone();
    let counts: Arc<[AtomicU64; KINDS.len()]> = Arc::default();
    let counted = counts.clone();
    tokio::spawn(async move {
        let mut listed = [false; KINDS.len()];
        while let Some(item) = events.next().await {
            match item {
                Ok((kind, init_done)) => {
                    counted[kind].fetch_add(1, Ordering::Release);
                    if init_done && !listed[kind] {
                        listed[kind] = true;
                        tracing::info!(kind = KINDS[kind].0, "listed for network policy");
                    }
                    if init_done && let Ok(mut health) = watched_health.lock() {
                        health.listed[kind] = true;
                        health.errors[kind] = None;
                    }
                    if listed.iter().all(|l| *l) {
                        changes.send_modify(|n| *n += 1);
                    }
                }
                // The watcher retries by itself (with backoff); the stores
                // keep what they had meanwhile. A kind never listed keeps
                // the node not ready for policy, with this error as why.
                Err((kind, e)) => {
                    metrics.policy_errors.inc();
                    let error = describe(kind, &e);
                    tracing::warn!(kind = KINDS[kind].0, %error, "network policy watch error; retrying");
                    if let Ok(mut health) = watched_health.lock() {
                        health.errors[kind] = Some(error);
                    }
                }
            }
        }
        tracing::error!("the network policy watches ended");
    });
    (
        PolicyObjects {
            policies,
            pods,
            namespaces,
            services,
            slices,
            cluster_policies,
            health,
            stamps,
            changed,
            slice_index,
            event_counts: counts,
        },
        receiver,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_found() -> watcher::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "the server could not find the requested resource"
        }))
        .unwrap();
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn readiness_names_each_kind_not_listed_with_its_api_version() {
        let mut health = Health {
            listed: [true, true, true, true, false, true],
            ..Health::default()
        };
        assert_eq!(
            health.problem().as_deref(),
            Some("EndpointSlice (discovery.k8s.io/v1) not listed yet")
        );
        health.listed[0] = false;
        health.errors[4] = Some(describe(4, &not_found()));
        let problem = health.problem().unwrap();
        assert!(
            problem.starts_with("NetworkPolicy (networking.k8s.io/v1) not listed yet; EndpointSlice (discovery.k8s.io/v1) cannot be listed: the API server does not serve discovery.k8s.io/v1 (every Kubernetes release flatnet supports, 1.35 and later, does)"),
            "{problem}"
        );
        health.listed = [true; KINDS.len()];
        assert_eq!(health.problem(), None);
    }

    #[test]
    fn an_error_other_than_not_found_is_said_as_it_is() {
        let forbidden: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "endpointslices.discovery.k8s.io is forbidden"
        }))
        .unwrap();
        let error = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(forbidden)));
        let said = describe(4, &error);
        assert!(!said.contains("does not serve"), "{said}");
        assert!(said.contains("is forbidden"), "{said}");
    }

    #[test]
    fn every_kind_is_watched_at_a_current_api_version() {
        // GA versions only, none deprecated on Kubernetes 1.37 (core/v1
        // Endpoints is, since 1.33: EndpointSlices stand for it).
        assert_eq!(
            KINDS,
            [
                ("NetworkPolicy", "networking.k8s.io/v1"),
                ("Pod", "v1"),
                ("Namespace", "v1"),
                ("Service", "v1"),
                ("EndpointSlice", "discovery.k8s.io/v1"),
                ("ClusterNetworkPolicy", "policy.networking.k8s.io/v1beta1"),
            ]
        );
    }
}

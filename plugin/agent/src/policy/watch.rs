//! What NetworkPolicy needs from the API server: every NetworkPolicy, Pod
//! and Namespace of the cluster (peers can be anywhere), and every Service
//! and EndpointSlice (egress to a ClusterIP is judged by its backends),
//! each kept by its own watcher (a re-list after a broken watch, backoff on
//! errors, as for Nodes): pods, NetworkPolicies, Services and
//! EndpointSlices, the many, in slim stores of the agent's own
//! (`object_store`), Namespaces in a kube reflector store. Nothing is computed here: each event bumps a counter
//! the agent's loop waits on, once all five lists are in, and each change
//! (not what a list brings) is stamped for the latency metrics
//! (`metrics::latency`).

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::services::{EndpointSlice, Service, WatchedEndpointSlice, WatchedService};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::Pod;
use super::changes::{
    CLUSTER_POLICY, Changed, ENDPOINT_SLICE, Key, NAMESPACE, POD, POLICY, SERVICE, SliceIndex,
};
use super::network_policy::{NetworkPolicy, WatchedNetworkPolicy};
use super::object_store::{Named, ObjectStore, Watched};
use super::pod::{PodStore, WatchedPod};
use super::tiers::{ClusterNetworkPolicy, WatchedClusterNetworkPolicy};
use crate::metrics::AgentMetrics;
use crate::metrics::latency::{ChangeStamps, TRIGGER_TIME, Taken};

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

/// Whether `error` says the API server does not serve the kind's API
/// version (a 404 for its collection).
fn not_served(error: &watcher::Error) -> bool {
    status_code(error) == Some(404)
}

fn status_code(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        _ => None,
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

/// One item of the merged streams: which kind, and whether it completed a
/// (re-)list; or which kind's watch failed, and how.
type Item = Result<(usize, bool), (usize, watcher::Error)>;

/// A kind's watch events, as the merged stream carries them.
type Events = Pin<Box<dyn Stream<Item = Item> + Send>>;

/// A watch event of `kind` as the merged stream carries it.
fn item<K>(kind: usize, event: Result<Event<K>, watcher::Error>) -> Item {
    event
        .map(|e| (kind, matches!(e, Event::InitDone)))
        .map_err(|e| (kind, e))
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
    let (policies, policy_events) = own::<WatchedNetworkPolicy>(&client, POLICY, log);
    let (pods, pod_events) = own::<WatchedPod>(&client, POD, log);
    let (namespaces, namespace_events) = reflected::<Namespace>(&client, NAMESPACE, log);
    let (services, service_events) = own::<WatchedService>(&client, SERVICE, log);
    let log = (&stamps, &changed, Some(&slice_index));
    let (slices, slice_events) = own::<WatchedEndpointSlice>(&client, ENDPOINT_SLICE, log);
    let log = (&stamps, &changed, None);
    let (cluster_policies, cluster_policy_events) =
        own::<WatchedClusterNetworkPolicy>(&client, CLUSTER_POLICY, log);
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

/// Where a watch logs its changes: the stamps, the change log, and for
/// EndpointSlices the index of the Services they serve.
type Log<'a> = (
    &'a ChangeStamps,
    &'a Arc<Mutex<Changed>>,
    Option<&'a Arc<Mutex<SliceIndex>>>,
);

/// What kube's watcher can watch and the merged stream can carry.
trait Watchable:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// All objects of kind `K` in a kube reflector store, and the stream of
/// its events, each change stamped and logged (once the store holds it),
/// slimmed first ([`slim_for_store`]).
fn reflected<K>(client: &Client, kind: usize, (stamps, changed, _): Log<'_>) -> (Store<K>, Events)
where
    K: Watchable,
{
    let (store, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let (stamps, changed) = (stamps.clone(), changed.clone());
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(slim_for_store)
        .reflect(writer)
        .map(move |event| {
            let keys = match &event {
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    let trigger = object.annotations().get(TRIGGER_TIME);
                    stamps.record(KINDS[kind].0, trigger.map(String::as_str));
                    Some(Some(vec![key_of(object)]))
                }
                // A (re-)list: what it leaves out was deleted unseen.
                Ok(Event::Init | Event::InitDone) => Some(None),
                Ok(Event::InitApply(_)) | Err(_) => None,
            };
            if let Some(keys) = keys
                && let Ok(mut changed) = changed.lock()
            {
                changed.record(kind, keys);
            }
            item(kind, event)
        });
    (store, Box::pin(events))
}

/// A watch of kind `kind` into a store of the agent's own
/// (`object_store`), each change stamped and logged once the store holds
/// it; for EndpointSlices (`slice_index`), a change logs the Services the
/// slice serves and served, and a (re-)list rebuilds the index beside the
/// store.
fn own<W>(
    client: &Client,
    kind: usize,
    (stamps, changed, slice_index): Log<'_>,
) -> (ObjectStore<W::Object>, Events)
where
    W: Watched + Watchable,
    W::Object: Send + Sync + 'static,
{
    let store = ObjectStore::default();
    let api: Api<W> = Api::all(client.clone());
    let (stamps, changed, kept) = (stamps.clone(), changed.clone(), store.clone());
    let slice_index = slice_index.cloned();
    // An optional kind's API not served: listed, and empty.
    let mut absent = false;
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |event| {
            if OPTIONAL.contains(&kind) {
                match &event {
                    Err(error) if not_served(error) => {
                        if std::mem::replace(&mut absent, true) {
                            return None;
                        }
                        let (name, api_version) = KINDS[kind];
                        tracing::info!(
                            kind = name,
                            "{api_version} is not served (its CRDs are not installed): none to enforce"
                        );
                        kept.apply(Event::<W>::Init);
                        kept.apply(Event::<W>::InitDone);
                        if let Ok(mut changed) = changed.lock() {
                            changed.record(kind, None);
                        }
                        return Some(Ok((kind, true)));
                    }
                    Ok(_) => absent = false,
                    Err(_) => {}
                }
            }
            let index = || slice_index.as_ref().and_then(|i| i.lock().ok());
            let keys = match &event {
                Ok(Event::Apply(watched) | Event::Delete(watched)) => {
                    let object = watched.object();
                    stamps.record(KINDS[kind].0, object.trigger_time());
                    let key = (object.namespace().to_string(), object.name().to_string());
                    let deleted = matches!(event, Ok(Event::Delete(_)));
                    let serves = object.serves().map(str::to_string);
                    Some(match slice_index {
                        None => Some(vec![key]),
                        Some(_) => index().map(|mut i| i.changed(key, serves.as_ref(), deleted)),
                    })
                }
                // A (re-)list: what it leaves out was deleted unseen.
                Ok(event @ (Event::Init | Event::InitDone)) => {
                    if let Some(mut index) = index() {
                        match event {
                            Event::Init => index.relist_started(),
                            _ => index.relist_done(),
                        }
                    }
                    Some(None)
                }
                Ok(Event::InitApply(watched)) => {
                    let object = watched.object();
                    if let Some(mut index) = index() {
                        let key = (object.namespace().to_string(), object.name().to_string());
                        index.listed(key, object.serves().map(str::to_string).as_ref());
                    }
                    None
                }
                Err(_) => None,
            };
            let item = match event {
                Ok(event) => {
                    let done = matches!(event, Event::InitDone);
                    kept.apply(event);
                    Ok((kind, done))
                }
                Err(error) => Err((kind, error)),
            };
            // Logged once the store holds it.
            if let Some(keys) = keys
                && let Ok(mut changed) = changed.lock()
            {
                changed.record(kind, keys);
            }
            Some(item)
        })
        .filter_map(futures::future::ready);
    (store, Box::pin(events))
}

/// What an object keeps in the store: its name, namespace, labels and, of
/// its annotations, the change's trigger time (the latency metrics read
/// it). The rest of its metadata is none of the agent's business: a
/// kubectl-applied object's last-applied annotation alone is as big as
/// the object again. resourceVersion the watcher has read already (it
/// resumes from the last one); the store and its key kept two copies.
pub fn slim_for_store<K: Resource>(object: &mut K) {
    let meta = std::mem::take(object.meta_mut());
    let trigger = meta
        .annotations
        .and_then(|mut a| a.remove_entry(TRIGGER_TIME))
        .map(|entry| std::collections::BTreeMap::from([entry]));
    *object.meta_mut() = kube::api::ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        labels: meta.labels,
        annotations: trigger,
        ..Default::default()
    };
}

fn key_of<K: Resource>(object: &K) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
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
    fn a_stored_object_keeps_its_name_labels_and_trigger_time_only() {
        let mut namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "shop", "uid": "u", "resourceVersion": "9",
                "labels": {"app": "web"}, "finalizers": ["x"],
                "annotations": {TRIGGER_TIME: "2026-11-30T10:00:00Z",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl"}]
            }
        }))
        .unwrap();
        slim_for_store(&mut namespace);
        let meta = &namespace.metadata;
        assert_eq!(meta.name.as_deref(), Some("shop"));
        assert_eq!(meta.labels.as_ref().unwrap()["app"], "web");
        let annotations: Vec<&String> = meta.annotations.iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(annotations, [TRIGGER_TIME]);
        assert!(meta.uid.is_none() && meta.resource_version.is_none());
        assert!(meta.finalizers.is_none() && meta.managed_fields.is_none());
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

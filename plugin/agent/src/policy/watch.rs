//! What NetworkPolicy needs from the API server: every NetworkPolicy, Pod
//! and Namespace of the cluster (peers can be anywhere), and every Service
//! and EndpointSlice (egress to a ClusterIP is judged by its backends),
//! each kept in a kube reflector store by its own watcher (a re-list after
//! a broken watch, backoff on errors, as for Nodes). Nothing is computed
//! here: each event bumps a counter the agent's loop waits on, once all
//! five lists are in.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::metrics::AgentMetrics;

/// The kinds, for log lines.
const KINDS: [&str; 5] = [
    "NetworkPolicy",
    "Pod",
    "Namespace",
    "Service",
    "EndpointSlice",
];

/// What the watches have seen so far.
#[derive(Clone)]
pub struct PolicyObjects {
    policies: Store<NetworkPolicy>,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    health: Arc<Mutex<Health>>,
}

/// Whether each kind has been listed, and its watch's last error since.
#[derive(Debug, Default)]
struct Health {
    listed: [bool; KINDS.len()],
    errors: [Option<String>; KINDS.len()],
    /// The EndpointSlice API version in use.
    slices: &'static str,
}

impl Health {
    /// Why the objects cannot be trusted yet: each kind not listed, with
    /// the last error of its watch; None once all are listed.
    fn problem(&self) -> Option<String> {
        let missing: Vec<String> = KINDS
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.listed[*i])
            .map(|(i, kind)| {
                let what = if i == 4 {
                    format!("{kind} ({})", self.slices)
                } else {
                    kind.to_string()
                };
                match &self.errors[i] {
                    Some(error) => format!("{what} cannot be listed: {error}"),
                    None => format!("{what} not listed yet"),
                }
            })
            .collect();
        (!missing.is_empty()).then(|| missing.join("; "))
    }
}

/// The objects as of now (shared with the stores, not copied).
pub struct Snapshot {
    pub policies: Vec<Arc<NetworkPolicy>>,
    pub pods: Vec<Arc<Pod>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<EndpointSlice>>,
}

impl PolicyObjects {
    /// Why the watched objects are incomplete (a kind not listed, and the
    /// error its watch last had); None once every kind is listed.
    pub fn problem(&self) -> Option<String> {
        self.health.lock().ok().and_then(|h| h.problem())
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            policies: self.policies.state(),
            pods: self.pods.state(),
            namespaces: self.namespaces.state(),
            services: self.services.state(),
            slices: self.slices.state(),
        }
    }
}

/// One item of the merged streams: which kind, and whether it completed a
/// (re-)list; or which kind's watch failed, and how.
type Item = Result<(usize, bool), (usize, watcher::Error)>;

/// A watch event of `kind` as the merged stream carries it.
fn item<K>(kind: usize, event: Result<Event<K>, watcher::Error>) -> Item {
    event
        .map(|e| (kind, matches!(e, Event::InitDone)))
        .map_err(|e| (kind, e))
}

/// Where the API server serves EndpointSlices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SliceApi {
    /// discovery.k8s.io/v1: Kubernetes 1.21 and later.
    V1,
    /// discovery.k8s.io/v1beta1 only: Kubernetes 1.17 to 1.20.
    V1Beta1,
}

fn v1beta1_slices() -> ApiResource {
    ApiResource {
        group: "discovery.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "discovery.k8s.io/v1beta1".into(),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    }
}

/// v1 unless the API server answers 404 for it and serves v1beta1; any
/// other answer (the server unreachable, forbidden) is left to v1's watch
/// to report and retry.
async fn slice_api(client: &Client) -> SliceApi {
    let probe = ListParams::default().limit(1);
    let missing = |result: &kube::Result<_>| matches!(result, Err(kube::Error::Api(status)) if status.code == 404);
    let v1 = Api::<EndpointSlice>::all(client.clone()).list(&probe).await;
    if !missing(&v1) {
        return SliceApi::V1;
    }
    let v1beta1 = Api::<DynamicObject>::all_with(client.clone(), &v1beta1_slices())
        .list(&probe)
        .await;
    if v1beta1.is_ok() {
        SliceApi::V1Beta1
    } else {
        SliceApi::V1
    }
}

/// A discovery.k8s.io/v1beta1 EndpointSlice as v1: the same fields, but the
/// endpoint's node is `topology["kubernetes.io/hostname"]` (v1's `nodeName`)
/// and its zone `topology["topology.kubernetes.io/zone"]` (v1's `zone`).
pub fn slice_from_v1beta1(object: DynamicObject) -> Option<EndpointSlice> {
    let mut value = serde_json::to_value(&object).ok()?;
    value["apiVersion"] = "discovery.k8s.io/v1".into();
    if let Some(endpoints) = value.get_mut("endpoints").and_then(|e| e.as_array_mut()) {
        for endpoint in endpoints {
            let topology = endpoint.get("topology").cloned().unwrap_or_default();
            if let Some(node) = topology.get("kubernetes.io/hostname") {
                endpoint["nodeName"] = node.clone();
            }
            if let Some(zone) = topology.get("topology.kubernetes.io/zone") {
                endpoint["zone"] = zone.clone();
            }
        }
    }
    serde_json::from_value(value).ok()
}

/// [`reflected`] for EndpointSlices served as v1beta1, kept as v1 objects.
fn reflected_v1beta1_slices(
    client: &Client,
    kind: usize,
) -> (
    Store<EndpointSlice>,
    Pin<Box<dyn Stream<Item = Item> + Send>>,
) {
    let (store, writer) = reflector::store();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &v1beta1_slices());
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        // An object that does not read as v1 is left out (and said).
        .try_filter_map(|event| {
            let converted = match event {
                Event::Apply(o) => slice_from_v1beta1(o).map(Event::Apply),
                Event::Delete(o) => slice_from_v1beta1(o).map(Event::Delete),
                Event::InitApply(o) => slice_from_v1beta1(o).map(Event::InitApply),
                Event::Init => Some(Event::Init),
                Event::InitDone => Some(Event::InitDone),
            };
            if converted.is_none() {
                tracing::warn!("a v1beta1 EndpointSlice that does not read as v1 is left out");
            }
            std::future::ready(Ok(converted))
        })
        .reflect(writer)
        .map(move |event| item(kind, event));
    (store, Box::pin(events))
}

/// Starts the watches. The receiver's value changes after every
/// event once all three kinds have been listed (never before: a plan from
/// a partial view would isolate pods from peers not seen yet); its sender
/// closing means the watches ended.
pub async fn spawn(client: Client, metrics: AgentMetrics) -> (PolicyObjects, watch::Receiver<u64>) {
    let (policies, policy_events) = reflected::<NetworkPolicy>(&client, 0);
    let (pods, pod_events) = reflected::<Pod>(&client, 1);
    let (namespaces, namespace_events) = reflected::<Namespace>(&client, 2);
    let (services, service_events) = reflected::<Service>(&client, 3);
    let health = Arc::new(Mutex::new(Health::default()));
    let (slices, slice_events) = match slice_api(&client).await {
        SliceApi::V1 => {
            health.lock().expect("fresh").slices = "discovery.k8s.io/v1";
            reflected::<EndpointSlice>(&client, 4)
        }
        SliceApi::V1Beta1 => {
            tracing::info!(
                "EndpointSlices from discovery.k8s.io/v1beta1 (the API server has no v1)"
            );
            health.lock().expect("fresh").slices = "discovery.k8s.io/v1beta1";
            reflected_v1beta1_slices(&client, 4)
        }
    };
    let mut events = futures::stream::select_all([
        policy_events,
        pod_events,
        namespace_events,
        service_events,
        slice_events,
    ]);
    let (changes, receiver) = watch::channel(0u64);
    let watched_health = health.clone();
    tokio::spawn(async move {
        let mut listed = [false; KINDS.len()];
        while let Some(item) = events.next().await {
            match item {
                Ok((kind, init_done)) => {
                    if init_done && !listed[kind] {
                        listed[kind] = true;
                        tracing::info!(kind = KINDS[kind], "listed for network policy");
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
                    tracing::warn!(kind = KINDS[kind], error = %e, "network policy watch error; retrying");
                    if let Ok(mut health) = watched_health.lock() {
                        health.errors[kind] = Some(e.to_string());
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
            health,
        },
        receiver,
    )
}

/// All objects of kind `K` in a store, and the stream of its events.
/// managedFields go before the store: they are most of a Pod's size and
/// none of policy's business.
fn reflected<K>(
    client: &Client,
    kind: usize,
) -> (Store<K>, Pin<Box<dyn Stream<Item = Item> + Send>>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object: &mut K| object.managed_fields_mut().clear())
        .reflect(writer)
        .map(move |event| item(kind, event));
    (store, Box::pin(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1beta1_slice_reads_as_v1_with_its_node_and_zone() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1beta1",
            "kind": "EndpointSlice",
            "metadata": {"namespace": "default", "name": "web-abc",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{
                "addresses": ["10.244.1.5"],
                "conditions": {"ready": true},
                "topology": {"kubernetes.io/hostname": "node-2",
                             "topology.kubernetes.io/zone": "a"}
            }],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .unwrap();
        let slice = slice_from_v1beta1(object).expect("reads as v1");
        assert_eq!(slice.address_type, "IPv4");
        let endpoint = &slice.endpoints.as_deref().unwrap_or_default()[0];
        assert_eq!(endpoint.addresses, vec!["10.244.1.5".to_string()]);
        assert_eq!(endpoint.node_name.as_deref(), Some("node-2"));
        assert_eq!(endpoint.zone.as_deref(), Some("a"));
        assert_eq!(
            endpoint.conditions.as_ref().and_then(|c| c.ready),
            Some(true)
        );
        let ports = slice.ports.unwrap_or_default();
        assert_eq!(ports[0].port, Some(8080));
    }
}

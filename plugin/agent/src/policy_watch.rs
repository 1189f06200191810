//! What NetworkPolicy needs from the API server: every NetworkPolicy, Pod
//! and Namespace of the cluster (peers can be anywhere), and every Service
//! and EndpointSlice (egress to a ClusterIP is judged by its backends),
//! each kept in a kube reflector store by its own watcher (a re-list after
//! a broken watch, backoff on errors, as for Nodes). Nothing is computed
//! here: each event bumps a counter the agent's loop waits on, once all
//! five lists are in.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::metrics::AgentMetrics;

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
/// (re-)list.
type Item = Result<(usize, bool), watcher::Error>;

/// Starts the watches. The receiver's value changes after every
/// event once all three kinds have been listed (never before: a plan from
/// a partial view would isolate pods from peers not seen yet); its sender
/// closing means the watches ended.
pub fn spawn(client: Client, metrics: AgentMetrics) -> (PolicyObjects, watch::Receiver<u64>) {
    let (policies, policy_events) = reflected::<NetworkPolicy>(&client, 0);
    let (pods, pod_events) = reflected::<Pod>(&client, 1);
    let (namespaces, namespace_events) = reflected::<Namespace>(&client, 2);
    let (services, service_events) = reflected::<Service>(&client, 3);
    let (slices, slice_events) = reflected::<EndpointSlice>(&client, 4);
    let mut events = futures::stream::select_all([
        policy_events,
        pod_events,
        namespace_events,
        service_events,
        slice_events,
    ]);
    let (changes, receiver) = watch::channel(0u64);
    tokio::spawn(async move {
        let mut listed = [false; KINDS.len()];
        while let Some(item) = events.next().await {
            match item {
                Ok((kind, init_done)) => {
                    if init_done && !listed[kind] {
                        listed[kind] = true;
                        tracing::info!(kind = KINDS[kind], "listed for network policy");
                    }
                    if listed.iter().all(|l| *l) {
                        changes.send_modify(|n| *n += 1);
                    }
                }
                // The watcher retries by itself (with backoff); the stores
                // keep what they had meanwhile.
                Err(e) => {
                    metrics.policy_errors.inc();
                    tracing::warn!(error = %e, "network policy watch error; retrying");
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
        .map(move |event| event.map(|e| (kind, matches!(e, Event::InitDone))));
    (store, Box::pin(events))
}

//! The snapshot source in a cluster: core/v1 Services and
//! discovery.k8s.io/v1 EndpointSlices of every namespace (not core/v1
//! Endpoints, deprecated since Kubernetes 1.33), each kept in a kube
//! reflector store by its own watcher (a re-list after a broken watch, backoff on
//! errors). Once both have been listed, every burst of events yields a
//! new snapshot on the channel the DNS server reads.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::error::WatchError;
use crate::snapshot::{ClusterSnapshot, ZoneConfig};

/// The kinds watched, for log lines; indexes of `listed`.
const KINDS: [&str; 2] = ["Service", "EndpointSlice"];

/// One watch event: which kind, and whether it completed a list.
type Item = Result<(usize, bool), (usize, watcher::Error)>;

/// All objects of kind `K` in a store, and the stream of its events.
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
        // managedFields are none of DNS's business.
        .modify(|object: &mut K| object.managed_fields_mut().clear())
        .reflect(writer)
        .map(move |event| match event {
            Ok(event) => Ok((kind, matches!(event, Event::InitDone))),
            Err(error) => Err((kind, error)),
        });
    (store, Box::pin(events))
}

/// The SOA serial: the time of the change, in seconds (as CoreDNS).
fn serial_now() -> u32 {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    // Truncated: serials compare in sequence-space arithmetic (RFC 1982).
    seconds as u32
}

/// Watches until the streams end (they do not, on their own: the watcher
/// retries) or the DNS server drops its receiver.
pub async fn run(
    client: Client,
    config: ZoneConfig,
    snapshots: watch::Sender<Arc<ClusterSnapshot>>,
) -> Result<(), WatchError> {
    let (services, service_events) = reflected::<Service>(&client, 0);
    let (slices, slice_events) = reflected::<EndpointSlice>(&client, 1);
    let mut events = futures::stream::select_all([service_events, slice_events]);
    let mut listed = [false; KINDS.len()];
    while let Some(first) = events.next().await {
        // Take the whole burst that is already there, then build once.
        let mut burst = vec![first];
        while let Some(Some(item)) = events.next().now_or_never() {
            burst.push(item);
        }
        for item in burst {
            match item {
                Ok((kind, true)) if !listed[kind] => {
                    listed[kind] = true;
                    tracing::info!(kind = KINDS[kind], "listed");
                }
                Ok(_) => {}
                // The watcher retries by itself (with backoff); the stores
                // keep what they had meanwhile.
                Err((kind, error)) => {
                    tracing::warn!(kind = KINDS[kind], %error, "watch error; retrying");
                }
            }
        }
        if !listed.iter().all(|l| *l) {
            continue;
        }
        let service_objects = services.state();
        let slice_objects = slices.state();
        let snapshot = ClusterSnapshot::build(
            config.clone(),
            service_objects.iter().map(Arc::as_ref),
            slice_objects.iter().map(Arc::as_ref),
            serial_now(),
        );
        let first_sync = !snapshots.borrow().is_synced();
        if snapshots.send(Arc::new(snapshot)).is_err() {
            return Err(WatchError::ServerGone);
        }
        if first_sync {
            tracing::info!(
                services = service_objects.len(),
                endpoint_slices = slice_objects.len(),
                "serving the cluster zone"
            );
        }
    }
    Err(WatchError::Ended)
}

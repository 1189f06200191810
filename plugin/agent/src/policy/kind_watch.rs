//! One kind's watch as the agent runs it (`watch` starts one per kind and
//! merges them): kube's watcher with backoff, into a kube reflector store
//! ([`reflected`], Namespaces) or a store of the agent's own ([`own`]),
//! each change stamped for the latency metrics and logged for the next
//! pass once the store holds it.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::changes::{Changed, Key, SliceIndex};
use super::object_store::{Named, ObjectStore, Watched};
use crate::metrics::latency::{ChangeStamps, TRIGGER_TIME};
use crate::watch_backoff::{backed_off, not_served};

/// Which kind a watch is of: its place in the merged stream, its name and
/// API version (log lines, stamps), and whether an API server may not
/// serve it (a CRD's kind: not served means none).
#[derive(Debug, Clone, Copy)]
pub(super) struct WatchedKind {
    pub index: usize,
    pub name: &'static str,
    pub api_version: &'static str,
    pub optional: bool,
}

/// One item of the merged streams: which kind, and whether it completed a
/// (re-)list; or which kind's watch failed, and how.
pub(super) type Item = Result<(usize, bool), (usize, watcher::Error)>;

/// A kind's watch events, as the merged stream carries them.
pub(super) type Events = Pin<Box<dyn Stream<Item = Item> + Send>>;

/// A watch event of `kind` as the merged stream carries it.
fn item<K>(kind: usize, event: Result<Event<K>, watcher::Error>) -> Item {
    event
        .map(|e| (kind, matches!(e, Event::InitDone)))
        .map_err(|e| (kind, e))
}

/// Where a watch logs its changes: the stamps, the change log, and for
/// EndpointSlices the index of the Services they serve.
pub(super) type Log<'a> = (
    &'a ChangeStamps,
    &'a Arc<Mutex<Changed>>,
    Option<&'a Arc<Mutex<SliceIndex>>>,
);

/// What kube's watcher can watch and the merged stream can carry.
pub(super) trait Watchable:
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
pub(super) fn reflected<K>(
    client: &Client,
    kind: WatchedKind,
    (stamps, changed, _): Log<'_>,
) -> (Store<K>, Events)
where
    K: Watchable,
{
    let (store, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let (stamps, changed) = (stamps.clone(), changed.clone());
    let events = backed_off(watcher::watcher(api, watcher::Config::default()), false)
        .modify(slim_for_store)
        .reflect(writer)
        .map(move |event| {
            let keys = match &event {
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    let trigger = object.annotations().get(TRIGGER_TIME);
                    stamps.record(kind.name, trigger.map(String::as_str));
                    Some(Some(vec![key_of(object)]))
                }
                // A (re-)list done: what it left out was deleted unseen.
                Ok(Event::InitDone) => Some(None),
                Ok(Event::Init | Event::InitApply(_)) | Err(_) => None,
            };
            if let Some(keys) = keys
                && let Ok(mut changed) = changed.lock()
            {
                changed.record(kind.index, keys);
            }
            item(kind.index, event)
        });
    (store, Box::pin(events))
}

/// A watch of kind `kind` into a store of the agent's own
/// (`object_store`), each change stamped and logged once the store holds
/// it; for EndpointSlices (`slice_index`), a change logs the Services the
/// slice serves and served, and a (re-)list rebuilds the index beside the
/// store.
pub(super) fn own<W>(
    client: &Client,
    kind: WatchedKind,
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
    let events = backed_off(
        watcher::watcher(api, watcher::Config::default()),
        kind.optional,
    )
    .map(move |event| {
        if kind.optional {
            match &event {
                // Another try at the list: no news until it answers.
                Ok(Event::Init) if absent => {
                    kept.apply(Event::<W>::Init);
                    return None;
                }
                Err(error) if not_served(error) => {
                    if std::mem::replace(&mut absent, true) {
                        return None;
                    }
                    tracing::info!(
                        kind = kind.name,
                        "{} is not served (its CRDs are not installed): none to enforce",
                        kind.api_version
                    );
                    kept.apply(Event::<W>::Init);
                    kept.apply(Event::<W>::InitDone);
                    if let Ok(mut changed) = changed.lock() {
                        changed.record(kind.index, None);
                    }
                    return Some(Ok((kind.index, true)));
                }
                Ok(_) => absent = false,
                Err(_) => {}
            }
        }
        let index = || slice_index.as_ref().and_then(|i| i.lock().ok());
        let keys = match &event {
            Ok(Event::Apply(watched) | Event::Delete(watched)) => {
                let object = watched.object();
                stamps.record(kind.name, object.trigger_time());
                let key = (object.namespace().to_string(), object.name().to_string());
                let deleted = matches!(event, Ok(Event::Delete(_)));
                let serves = object.serves().map(str::to_string);
                Some(match slice_index {
                    None => Some(vec![key]),
                    Some(_) => index().map(|mut i| i.changed(key, serves.as_ref(), deleted)),
                })
            }
            // A list begins: nothing changes until it is done.
            Ok(Event::Init) => {
                if let Some(mut index) = index() {
                    index.relist_started();
                }
                None
            }
            // A (re-)list done: what it left out was deleted unseen.
            Ok(Event::InitDone) => {
                if let Some(mut index) = index() {
                    index.relist_done();
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
                Ok((kind.index, done))
            }
            Err(error) => Err((kind.index, error)),
        };
        // Logged once the store holds it.
        if let Some(keys) = keys
            && let Ok(mut changed) = changed.lock()
        {
            changed.record(kind.index, keys);
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
    use k8s_openapi::api::core::v1::Namespace;

    use super::*;

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
}

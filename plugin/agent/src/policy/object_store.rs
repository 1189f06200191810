//! The agent's own stores of the objects it keeps many of: pods,
//! NetworkPolicies, Services and EndpointSlices. kube's watcher feeds one as it would its reflector
//! store (a re-list is gathered aside and replaces the store when
//! complete; what it leaves out was deleted unseen), but it keeps the
//! agent's slim object alone: kube's store keeps each object's `ObjectMeta`
//! (about 330 B before any field is set) and a key of four strings. At the
//! scale harness's xl size a pod costs 212 B here, 709 B in kube's store.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::runtime::watcher::Event;

/// What a store keeps objects by.
pub trait Named {
    fn namespace(&self) -> &Arc<str>;
    fn name(&self) -> &Arc<str>;
    /// The change's trigger time, for kinds that carry one (the latency
    /// metrics read it).
    fn trigger_time(&self) -> Option<&str> {
        None
    }
    /// The Service an EndpointSlice serves (its service-name label); None
    /// for the other kinds.
    fn serves(&self) -> Option<&str> {
        None
    }
}

/// What kube's watcher decodes for a store: the object the store keeps,
/// beside the metadata the watcher reads.
pub trait Watched: Into<Self::Object> {
    type Object: Named;
    fn object(&self) -> &Self::Object;
}

/// Objects by namespace, then name.
type ByNamespace<T> = HashMap<Arc<str>, HashMap<Arc<str>, Arc<T>>>;

/// A shared handle on the objects; clones see the same store.
pub struct ObjectStore<T> {
    inner: Arc<RwLock<Objects<T>>>,
}

impl<T> Clone for ObjectStore<T> {
    fn clone(&self) -> Self {
        ObjectStore {
            inner: self.inner.clone(),
        }
    }
}

impl<T> Default for ObjectStore<T> {
    fn default() -> Self {
        ObjectStore {
            inner: Arc::new(RwLock::new(Objects {
                current: HashMap::new(),
                relisting: None,
            })),
        }
    }
}

struct Objects<T> {
    current: ByNamespace<T>,
    /// A re-list under way: what it has brought so far.
    relisting: Option<ByNamespace<T>>,
}

fn insert<T: Named>(objects: &mut ByNamespace<T>, object: T) {
    let name = object.name().clone();
    objects
        .entry(object.namespace().clone())
        .or_default()
        .insert(name, Arc::new(object));
}

impl<T: Named> ObjectStore<T> {
    /// Applies one of the watcher's events, taking its object.
    pub fn apply<W: Into<T>>(&self, event: Event<W>) {
        let Ok(mut objects) = self.inner.write() else {
            return;
        };
        match event {
            Event::Apply(watched) => insert(&mut objects.current, watched.into()),
            Event::Delete(watched) => {
                let object: T = watched.into();
                if let Some(names) = objects.current.get_mut(&**object.namespace()) {
                    names.remove(&**object.name());
                    if names.is_empty() {
                        objects.current.remove(&**object.namespace());
                    }
                }
            }
            Event::Init => objects.relisting = Some(ByNamespace::new()),
            Event::InitApply(watched) => {
                if let Some(relisting) = objects.relisting.as_mut() {
                    insert(relisting, watched.into());
                }
            }
            Event::InitDone => {
                if let Some(listed) = objects.relisting.take() {
                    objects.current = listed;
                }
            }
        }
    }

    /// Object `namespace/name` as the store holds it now.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        let objects = self.inner.read().ok()?;
        objects.current.get(namespace)?.get(name).cloned()
    }

    /// Every object, as of now (shared with the store, not copied).
    pub fn state(&self) -> Vec<Arc<T>> {
        let Ok(objects) = self.inner.read() else {
            return Vec::new();
        };
        objects
            .current
            .values()
            .flat_map(|names| names.values().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::policy::pod::{PodStore, WatchedPod};

    fn watched(namespace: &str, name: &str, ip: &str) -> WatchedPod {
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"},
            "status": {"podIPs": [{"ip": ip}]}
        }))
        .unwrap()
    }

    fn names(store: &PodStore) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn applies_and_deletes() {
        let store = PodStore::default();
        store.apply(Event::Apply(watched("a", "one", "10.0.0.1")));
        store.apply(Event::Apply(watched("b", "two", "10.0.0.2")));
        store.apply(Event::Apply(watched("a", "one", "10.0.0.3")));
        assert_eq!(names(&store), ["a/one", "b/two"]);
        let one = store.get("a", "one").unwrap();
        assert_eq!(one.ips[0].to_string(), "10.0.0.3");
        store.apply(Event::Delete(watched("a", "one", "10.0.0.3")));
        assert!(store.get("a", "one").is_none());
        assert_eq!(names(&store), ["b/two"]);
    }

    #[test]
    fn a_relist_replaces_the_store_once_complete() {
        let store = PodStore::default();
        store.apply(Event::Apply(watched("a", "gone", "10.0.0.1")));
        store.apply(Event::<WatchedPod>::Init);
        store.apply(Event::InitApply(watched("a", "kept", "10.0.0.2")));
        // Until the list is complete, the store is what it was.
        assert_eq!(names(&store), ["a/gone"]);
        store.apply(Event::<WatchedPod>::InitDone);
        assert_eq!(names(&store), ["a/kept"]);
    }
}

//! The agent's own store of pods. kube's watcher feeds it as it would its
//! reflector store (a re-list is gathered aside and replaces the store
//! when complete; what it leaves out was deleted unseen), but it keeps the
//! slim [`Pod`] alone: kube's store keeps each object's `ObjectMeta`
//! (about 330 B before any field is set) and a key of four strings. At the
//! scale harness's xl size a pod costs 212 B here, 709 B in kube's store.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::runtime::watcher::Event;

use super::pod::{Pod, WatchedPod};

/// Pods by namespace, then name.
type ByNamespace = HashMap<Arc<str>, HashMap<Arc<str>, Arc<Pod>>>;

/// A shared handle on the pods; clones see the same store.
#[derive(Clone, Default)]
pub struct PodStore {
    inner: Arc<RwLock<Pods>>,
}

#[derive(Default)]
struct Pods {
    current: ByNamespace,
    /// A re-list under way: what it has brought so far.
    relisting: Option<ByNamespace>,
}

fn insert(pods: &mut ByNamespace, pod: Pod) {
    let name = pod.name.clone();
    pods.entry(pod.namespace.clone())
        .or_default()
        .insert(name, Arc::new(pod));
}

impl PodStore {
    /// Applies one of the watcher's events, taking its pod.
    pub fn apply(&self, event: Event<WatchedPod>) {
        let Ok(mut pods) = self.inner.write() else {
            return;
        };
        match event {
            Event::Apply(watched) => insert(&mut pods.current, watched.pod),
            Event::Delete(watched) => {
                let pod = watched.pod;
                if let Some(names) = pods.current.get_mut(&*pod.namespace) {
                    names.remove(&*pod.name);
                    if names.is_empty() {
                        pods.current.remove(&*pod.namespace);
                    }
                }
            }
            Event::Init => pods.relisting = Some(ByNamespace::new()),
            Event::InitApply(watched) => {
                if let Some(relisting) = pods.relisting.as_mut() {
                    insert(relisting, watched.pod);
                }
            }
            Event::InitDone => {
                if let Some(listed) = pods.relisting.take() {
                    pods.current = listed;
                }
            }
        }
    }

    /// Pod `namespace/name` as the store holds it now.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let pods = self.inner.read().ok()?;
        pods.current.get(namespace)?.get(name).cloned()
    }

    /// Every pod, as of now (shared with the store, not copied).
    pub fn state(&self) -> Vec<Arc<Pod>> {
        let Ok(pods) = self.inner.read() else {
            return Vec::new();
        };
        pods.current
            .values()
            .flat_map(|names| names.values().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
        store.apply(Event::Init);
        store.apply(Event::InitApply(watched("a", "kept", "10.0.0.2")));
        // Until the list is complete, the store is what it was.
        assert_eq!(names(&store), ["a/gone"]);
        store.apply(Event::InitDone);
        assert_eq!(names(&store), ["a/kept"]);
    }
}

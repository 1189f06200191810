//! What the watches log for the agent's passes (`watch`): which objects
//! changed since a pass last looked ([`Changed`]), and which EndpointSlices
//! serve each Service ([`SliceIndex`]), so a Service's change reads its own
//! slices instead of all of them.

use std::collections::{BTreeSet, HashMap};

/// The watched kinds' places in `watch::KINDS`.
pub const POLICY: usize = 0;
pub const POD: usize = 1;
pub const NAMESPACE: usize = 2;
pub const SERVICE: usize = 3;
pub const ENDPOINT_SLICE: usize = 4;
pub const CLUSTER_POLICY: usize = 5;

/// Pods changed between two passes beyond which the next pass is a whole
/// one anyway (it costs less than so many changes, and bounds the log).
const MAX_CHANGED_PODS: usize = 4096;

/// A namespaced object's namespace and name.
pub type Key = (String, String);

/// What changed since a pass last took it: what lets the next one skip
/// the work a change cannot affect (`policy::incremental`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    /// A change a pass cannot follow object by object: a (re-)list, in
    /// which a deletion comes without its own event, or a Namespace.
    pub whole: bool,
    /// Pods and NetworkPolicies by namespace and name.
    pub pods: BTreeSet<Key>,
    pub policies: BTreeSet<Key>,
    /// The Services changed, by namespace and name: a Service's own
    /// events, and those of the EndpointSlices serving it (or that did).
    pub services: BTreeSet<Key>,
}

impl Changed {
    /// `keys` changed (a Service's for its kind and EndpointSlices); None:
    /// something a pass cannot follow.
    pub fn record(&mut self, kind: usize, keys: Option<Vec<Key>>) {
        let Some(keys) = keys else {
            self.whole = true;
            return;
        };
        match kind {
            POD => {
                self.pods.extend(keys);
                if self.pods.len() > MAX_CHANGED_PODS {
                    self.pods.clear();
                    self.whole = true;
                }
            }
            POLICY => self.policies.extend(keys),
            SERVICE | ENDPOINT_SLICE => self.services.extend(keys),
            _ => self.whole = true,
        }
    }
}

/// Which Service each EndpointSlice serves (its `kubernetes.io/service-name`
/// label) and the slices of each Service, as last seen.
#[derive(Debug, Default)]
struct Links {
    serves: HashMap<Key, String>,
    slices: HashMap<Key, BTreeSet<String>>,
}

impl Links {
    /// Slice `key` serves `service` now (None: none, or it is gone); the
    /// Services this changes: the one it serves and the one it served.
    fn link(&mut self, (namespace, name): Key, service: Option<&String>) -> Vec<Key> {
        let slice = (namespace.clone(), name.clone());
        let before = match service {
            Some(service) => self.serves.insert(slice, service.clone()),
            None => self.serves.remove(&slice),
        };
        if let Some(before) = &before {
            let key = (namespace.clone(), before.clone());
            if let Some(names) = self.slices.get_mut(&key) {
                names.remove(&name);
                if names.is_empty() {
                    self.slices.remove(&key);
                }
            }
        }
        if let Some(service) = service {
            let key = (namespace.clone(), service.clone());
            self.slices.entry(key).or_default().insert(name);
        }
        let mut services: Vec<Key> = before
            .into_iter()
            .chain(service.cloned())
            .map(|service| (namespace.clone(), service))
            .collect();
        services.dedup();
        services
    }
}

/// [`Links`] as the store holds the slices: a re-list builds a new one
/// beside, which takes over when the list is done (as the store swaps in
/// what it listed), so a pass never reads a half-listed index.
#[derive(Debug, Default)]
pub struct SliceIndex {
    now: Links,
    relisting: Option<Links>,
}

impl SliceIndex {
    /// Slice `key` (labelled `service` now; gone when `deleted`) changed:
    /// the Services this changes.
    pub fn changed(&mut self, key: Key, service: Option<&String>, deleted: bool) -> Vec<Key> {
        self.now.link(key, service.filter(|_| !deleted))
    }

    pub fn relist_started(&mut self) {
        self.relisting = Some(Links::default());
    }

    /// Slice `key`, labelled `service`, is in the list being read.
    pub fn listed(&mut self, key: Key, service: Option<&String>) {
        self.relisting
            .get_or_insert_with(Links::default)
            .link(key, service);
    }

    pub fn relist_done(&mut self) {
        if let Some(listed) = self.relisting.take() {
            self.now = listed;
        }
    }

    /// The names of the slices serving Service `key`.
    pub fn slices_of(&self, key: &Key) -> impl Iterator<Item = &String> {
        self.now.slices.get(key).into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("x".to_string(), name.to_string())
    }

    #[test]
    fn the_change_log_names_pods_and_policies_and_asks_for_a_whole_pass_otherwise() {
        let one = |name: &str| Some(vec![key(name)]);
        let mut changed = Changed::default();
        changed.record(POD, one("a"));
        changed.record(POLICY, one("p"));
        changed.record(ENDPOINT_SLICE, one("s"));
        assert_eq!(
            changed,
            Changed {
                whole: false,
                pods: BTreeSet::from([key("a")]),
                policies: BTreeSet::from([key("p")]),
                services: BTreeSet::from([key("s")]),
            }
        );
        // A namespace, or a list of any kind.
        let mut namespace = Changed::default();
        namespace.record(NAMESPACE, one("x"));
        assert!(namespace.whole);
        let mut listed = Changed::default();
        listed.record(POD, None);
        assert!(listed.whole);
        // So many pods that a whole pass costs less: the log stays small.
        let mut many = Changed::default();
        for i in 0..=MAX_CHANGED_PODS {
            many.record(POD, one(&i.to_string()));
        }
        assert!(many.whole && many.pods.is_empty());
    }

    #[test]
    fn a_slices_event_changes_the_service_it_serves_and_the_one_it_served() {
        let mut index = SliceIndex::default();
        let slice = || key("web-abc");
        let (web, api) = ("web".to_string(), "api".to_string());
        let slices_of = |index: &SliceIndex, service: &str| -> Vec<String> {
            index.slices_of(&key(service)).cloned().collect()
        };
        assert_eq!(index.changed(slice(), Some(&web), false), [key("web")]);
        assert_eq!(index.changed(slice(), Some(&web), false), [key("web")]);
        assert_eq!(slices_of(&index, "web"), ["web-abc"]);
        assert_eq!(
            index.changed(slice(), Some(&api), false),
            [key("web"), key("api")]
        );
        assert_eq!(slices_of(&index, "web"), Vec::<String>::new());
        assert_eq!(slices_of(&index, "api"), ["web-abc"]);
        assert_eq!(index.changed(slice(), None, false), [key("api")]);
        assert_eq!(index.changed(slice(), None, false), []);
        assert_eq!(slices_of(&index, "api"), Vec::<String>::new());
        index.changed(slice(), Some(&web), false);
        assert_eq!(index.changed(slice(), Some(&web), true), [key("web")]);
        assert_eq!(slices_of(&index, "web"), Vec::<String>::new());
    }

    #[test]
    fn a_relist_takes_over_only_once_done() {
        let mut index = SliceIndex::default();
        let web = "web".to_string();
        index.changed(key("web-1"), Some(&web), false);
        index.changed(key("web-2"), Some(&web), false);
        // web-1 was deleted while the watch was down: the list lacks it.
        index.relist_started();
        index.listed(key("web-2"), Some(&web));
        let listed: Vec<&String> = index.slices_of(&key("web")).collect();
        assert_eq!(listed, ["web-1", "web-2"], "the old index until done");
        index.relist_done();
        let listed: Vec<&String> = index.slices_of(&key("web")).collect();
        assert_eq!(listed, ["web-2"]);
    }
}

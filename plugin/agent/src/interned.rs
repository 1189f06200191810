//! One shared copy of values that many watched objects repeat: the label
//! sets of a Deployment's pods, their container ports, node names, phases,
//! and the endpoints' node names of EndpointSlices.
//! At 150,000 pods each pod's own copy of its labels was about 600 bytes
//! (a B-tree node and a string per key and value); shared, it is a pointer.
//!
//! A value is held here for as long as some object holds it; the ones no
//! object holds any more are dropped when the table has doubled since the
//! last time it was swept, so the sweeps cost O(1) per insertion.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex};

/// A table of shared values of type `T`.
pub struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

struct Table<T: ?Sized> {
    values: HashSet<Arc<T>>,
    /// Size of `values` after the last sweep.
    swept: usize,
}

/// Below this many values the table is never swept.
const SWEEP_FROM: usize = 1024;

impl<T: ?Sized + Eq + Hash> Interner<T> {
    pub fn new() -> Self {
        Interner {
            table: Mutex::new(Table {
                values: HashSet::new(),
                swept: 0,
            }),
        }
    }

    /// The shared copy of `value`, made from it (`make`) when there is none.
    pub fn get<Q>(&self, value: &Q, make: impl FnOnce() -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Eq + Hash,
    {
        let Ok(mut table) = self.table.lock() else {
            // A panic elsewhere poisoned it: an own copy is still right.
            return make();
        };
        if let Some(shared) = table.values.get(value) {
            return shared.clone();
        }
        let made = make();
        table.values.insert(made.clone());
        if table.values.len() >= (2 * table.swept).max(SWEEP_FROM) {
            // Held only by the table: no object has it any more.
            table.values.retain(|v| Arc::strong_count(v) > 1);
            table.swept = table.values.len();
        }
        made
    }

    /// How many values the table holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().map(|t| t.values.len()).unwrap_or(0)
    }
}

impl<T: ?Sized + Eq + Hash> Default for Interner<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner<str> {
    /// The shared copy of `text`.
    pub fn text(&self, text: &str) -> Arc<str> {
        self.get(text, || Arc::from(text))
    }
}

/// Names that many objects repeat: namespaces, nodes, phases, the Services
/// EndpointSlices serve, address types.
static NAMES: LazyLock<Interner<str>> = LazyLock::new(Interner::new);

/// The shared copy of a name that many objects repeat.
pub fn name(text: &str) -> Arc<str> {
    NAMES.text(text)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn equal_values_share_one_copy() {
        let table: Interner<BTreeMap<String, String>> = Interner::new();
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let a = table.get(&labels, || Arc::new(labels.clone()));
        let b = table.get(&labels, || Arc::new(labels.clone()));
        assert!(Arc::ptr_eq(&a, &b));
        let other = BTreeMap::from([("app".to_string(), "db".to_string())]);
        let c = table.get(&other, || Arc::new(other.clone()));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn values_no_object_holds_go_when_the_table_has_doubled() {
        let table: Interner<str> = Interner::new();
        let kept = table.text("kept");
        for i in 0..SWEEP_FROM * 4 {
            // Each dropped at once: only the table holds it.
            drop(table.text(&format!("gone-{i}")));
        }
        assert!(table.len() < SWEEP_FROM * 2, "{}", table.len());
        assert!(Arc::ptr_eq(&kept, &table.text("kept")));
    }
}

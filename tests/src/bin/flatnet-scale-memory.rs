//! `flatnet-scale-memory <size>`: how much memory the agent's watch stores
//! hold for a synthetic cluster of `size` (`scale::objects`), per kind.
//! Each object is decoded from its JSON into the type the agent watches it
//! as and kept as the agent keeps it (Namespaces slimmed in a kube
//! reflector store, the other kinds in stores of its own); an allocator
//! that counts live bytes tells each kind's share. Prints one JSON object:
//! per kind, the objects and the bytes. `cargo xtask scale` adds it to each
//! size's row, beside the agent's resident memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, bail};
use flatnet_agent::policy::network_policy::WatchedNetworkPolicy;
use flatnet_agent::policy::object_store::{Named, ObjectStore, Watched};
use flatnet_agent::policy::pod::WatchedPod;
use flatnet_agent::policy::watch::slim_for_store;
use flatnet_agent::services::{WatchedEndpointSlice, WatchedService};
use flatnet_tests::kube_stub::Kind;
use flatnet_tests::scale::objects;
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;
use serde_json::json;

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a
// counter is kept beside.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Decodes an object's JSON into a store.
type Put = Box<dyn FnMut(&[u8]) -> anyhow::Result<()>>;

/// One kind's store, and what it holds.
struct Held {
    put: Put,
    objects: usize,
    bytes: usize,
}

impl Held {
    fn new(put: Put) -> Self {
        Held {
            put,
            objects: 0,
            bytes: 0,
        }
    }

    /// A kube reflector store of `K`, as the agent keeps every kind but pods.
    fn reflected<K>() -> Self
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + 'static,
    {
        let (_store, mut writer) = reflector::store::<K>();
        Held::new(Box::new(move |text| {
            let mut object: K = serde_json::from_slice(text)?;
            slim_for_store(&mut object);
            writer.apply_watcher_event(&Event::Apply(object));
            Ok(())
        }))
    }

    /// A store of the agent's own (every kind but Namespaces).
    fn own<W>() -> Self
    where
        W: Watched + DeserializeOwned + 'static,
        W::Object: Named + 'static,
    {
        let store = ObjectStore::<W::Object>::default();
        Held::new(Box::new(move |text| {
            let object: W = serde_json::from_slice(text)?;
            store.apply(Event::Apply(object));
            Ok(())
        }))
    }

    /// Decodes `text` into the store, counting what that keeps.
    fn keep(&mut self, text: &[u8]) -> anyhow::Result<()> {
        let before = LIVE.load(Ordering::Relaxed);
        (self.put)(text)?;
        self.objects += 1;
        self.bytes += LIVE.load(Ordering::Relaxed).saturating_sub(before);
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        json!({"objects": self.objects, "bytes": self.bytes})
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [size] = args.as_slice() else {
        bail!("usage: flatnet-scale-memory <size: xs|s|m|l|xl>");
    };
    let size = objects::size_named(size).with_context(|| format!("no size {size}"))?;
    let mut pods = Held::own::<WatchedPod>();
    let mut policies = Held::own::<WatchedNetworkPolicy>();
    let mut namespaces = Held::reflected::<Namespace>();
    let mut services = Held::own::<WatchedService>();
    let mut slices = Held::own::<WatchedEndpointSlice>();
    for (kind, value) in objects::all(&size, "2026-01-01T00:00:00Z") {
        let text = serde_json::to_vec(&value)?;
        drop(value);
        match kind {
            Kind::Pod => pods.keep(&text)?,
            Kind::NetworkPolicy => policies.keep(&text)?,
            Kind::Namespace => namespaces.keep(&text)?,
            Kind::Service => services.keep(&text)?,
            Kind::EndpointSlice => slices.keep(&text)?,
            // Nodes are the peer source's, not in these stores.
            _ => {}
        }
    }
    let report: BTreeMap<&str, serde_json::Value> = BTreeMap::from([
        ("Pod", pods.report()),
        ("NetworkPolicy", policies.report()),
        ("Namespace", namespaces.report()),
        ("Service", services.report()),
        ("EndpointSlice", slices.report()),
    ]);
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

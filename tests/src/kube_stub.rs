//! An in-process stub of the Kubernetes API server for the agent's
//! watches: list and watch of Nodes, Pods, Namespaces and (all namespaces')
//! NetworkPolicies, Services and EndpointSlices, from in-memory objects a test adds, changes and
//! deletes. Each change is a watch event with the next resourceVersion
//! (one counter for all kinds, as etcd's); a watch replays what came after
//! the resourceVersion it asks for, then follows, and stays open as a real
//! one does. Nodes start from recorded Node JSON
//! (tests/fixtures/kube-nodes.json).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::TcpListener;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

const NODES_FIXTURE: &str = include_str!("../fixtures/kube-nodes.json");

/// The kinds the stub serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    Pod,
    Namespace,
    NetworkPolicy,
    Service,
    EndpointSlice,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Node,
        Kind::Pod,
        Kind::Namespace,
        Kind::NetworkPolicy,
        Kind::Service,
        Kind::EndpointSlice,
    ];

    /// The collection's path (every namespace's, for namespaced kinds).
    pub fn path(self) -> &'static str {
        match self {
            Kind::Node => "/api/v1/nodes",
            Kind::Pod => "/api/v1/pods",
            Kind::Namespace => "/api/v1/namespaces",
            Kind::NetworkPolicy => "/apis/networking.k8s.io/v1/networkpolicies",
            Kind::Service => "/api/v1/services",
            Kind::EndpointSlice => "/apis/discovery.k8s.io/v1/endpointslices",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            _ => "v1",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
        }
    }
}

/// An object's key: `namespace/name`, or `name` when cluster-scoped.
fn key_of(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().expect("metadata.name");
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

#[derive(Default)]
struct ApiState {
    version: u64,
    objects: BTreeMap<Kind, BTreeMap<String, Value>>,
    /// (resourceVersion, kind, watch event) in order.
    events: Vec<(u64, Kind, Value)>,
    lists: HashMap<Kind, usize>,
    watches: HashMap<Kind, usize>,
    /// EndpointSlices not served at all (an API server without
    /// discovery.k8s.io/v1, as before Kubernetes 1.21).
    no_slices: bool,
    /// Requests for paths it does not serve (CRDs not installed), by path.
    not_served: HashMap<String, usize>,
}

/// The stub's objects; cheap to clone (shared).
#[derive(Clone)]
pub struct ApiStub {
    state: Arc<Mutex<ApiState>>,
    changed: Arc<tokio::sync::Notify>,
}

impl ApiStub {
    /// Nothing of any kind.
    pub fn empty() -> Self {
        ApiStub {
            state: Arc::new(Mutex::new(ApiState {
                version: 1,
                ..ApiState::default()
            })),
            changed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The recorded nodes (cp-1, worker-1, worker-2), nothing else.
    pub fn from_fixture() -> Self {
        let list: Value = serde_json::from_str(NODES_FIXTURE).expect("fixture");
        let stub = ApiStub::empty();
        {
            let mut state = stub.lock();
            state.version = list["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("list resourceVersion");
            let nodes = state.objects.entry(Kind::Node).or_default();
            for item in list["items"].as_array().expect("items") {
                nodes.insert(key_of(item), item.clone());
            }
        }
        stub
    }

    /// Serves no EndpointSlices: discovery.k8s.io/v1's path answers 404
    /// with a Status, as kube-apiserver does for an API it does not serve.
    pub fn without_endpoint_slices(&self) {
        self.lock().no_slices = true;
    }

    fn lock(&self) -> MutexGuard<'_, ApiState> {
        // A test that panicked holding it has failed already.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stamps `object` with the next resourceVersion, stores it (or takes
    /// it away, for DELETED) and records the event.
    fn record(&self, kind: Kind, event: &str, mut object: Value) {
        let mut state = self.lock();
        state.version += 1;
        let version = state.version;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.name());
        let key = key_of(&object);
        let objects = state.objects.entry(kind).or_default();
        if event == "DELETED" {
            objects.remove(&key);
        } else {
            objects.insert(key, object.clone());
        }
        state
            .events
            .push((version, kind, json!({"type": event, "object": object})));
        drop(state);
        self.changed.notify_waiters();
    }

    /// An ADDED event (MODIFIED when an object of that key exists).
    pub fn add(&self, kind: Kind, object: Value) {
        let exists = self
            .lock()
            .objects
            .get(&kind)
            .is_some_and(|o| o.contains_key(&key_of(&object)));
        let event = if exists { "MODIFIED" } else { "ADDED" };
        self.record(kind, event, object);
    }

    /// A MODIFIED event for `key` (`namespace/name` or `name`) after `change`.
    pub fn modify(&self, kind: Kind, key: &str, change: impl FnOnce(&mut Value)) {
        let mut object = self
            .get(kind, key)
            .unwrap_or_else(|| panic!("no {kind:?} {key}"));
        change(&mut object);
        self.record(kind, "MODIFIED", object);
    }

    pub fn delete(&self, kind: Kind, key: &str) {
        let object = self
            .get(kind, key)
            .unwrap_or_else(|| panic!("no {kind:?} {key}"));
        self.record(kind, "DELETED", object);
    }

    pub fn get(&self, kind: Kind, key: &str) -> Option<Value> {
        self.lock().objects.get(&kind)?.get(key).cloned()
    }

    /// Every object of `kind` now, by key.
    pub fn list(&self, kind: Kind) -> Vec<Value> {
        self.lock()
            .objects
            .get(&kind)
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Lists of `kind` served.
    pub fn lists(&self, kind: Kind) -> usize {
        self.lock().lists.get(&kind).copied().unwrap_or(0)
    }

    /// Watches of `kind` started.
    pub fn watches(&self, kind: Kind) -> usize {
        self.lock().watches.get(&kind).copied().unwrap_or(0)
    }

    pub fn router(&self) -> axum::Router {
        let mut router = axum::Router::new();
        for kind in Kind::ALL {
            router = router.route(
                kind.path(),
                axum::routing::get(
                    move |State(stub): State<ApiStub>, RawQuery(raw): RawQuery| {
                        collection(kind, stub, raw)
                    },
                ),
            );
        }
        router
            .fallback(
                |State(stub): State<ApiStub>, uri: axum::http::Uri| async move {
                    *stub
                        .lock()
                        .not_served
                        .entry(uri.path().to_string())
                        .or_default() += 1;
                    not_found()
                },
            )
            .with_state(self.clone())
    }

    /// How many requests came for `path`, which it does not serve.
    pub fn not_served_requests(&self, path: &str) -> usize {
        self.lock().not_served.get(path).copied().unwrap_or(0)
    }
}

/// What kube-apiserver answers for an API it does not serve.
fn not_found() -> Response {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": "the server could not find the requested resource",
                        "reason": "NotFound", "details": {}, "code": 404});
    let json_type = [(header::CONTENT_TYPE, "application/json")];
    (StatusCode::NOT_FOUND, json_type, status.to_string()).into_response()
}

/// A list of `kind`, or with `watch=true` its events after the asked
/// resourceVersion, one JSON object a line, then the ones to come.
async fn collection(kind: Kind, stub: ApiStub, raw: Option<String>) -> Response {
    // kube's parameters are plain words and numbers: no percent-decoding needed.
    let raw = raw.unwrap_or_default();
    let query: HashMap<&str, &str> = raw.split('&').filter_map(|p| p.split_once('=')).collect();
    let json_type = [(header::CONTENT_TYPE, "application/json")];
    if kind == Kind::EndpointSlice && stub.lock().no_slices {
        return not_found();
    }
    if !matches!(query.get("watch"), Some(&("true" | "1"))) {
        let mut state = stub.lock();
        let page = Page::of(&query, state.version);
        if page.after.is_none() {
            // A list, however many pages it takes.
            *state.lists.entry(kind).or_default() += 1;
        }
        let objects = state.objects.get(&kind);
        let rest = objects.into_iter().flat_map(|o| match &page.after {
            Some(last) => o.range::<String, _>((Excluded(last), Unbounded)),
            None => o.range::<String, _>(..),
        });
        let mut items: Vec<(&String, &Value)> = rest.take(page.limit.saturating_add(1)).collect();
        let more = items.len() > page.limit;
        items.truncate(page.limit);
        let mut metadata = json!({"resourceVersion": page.version.to_string()});
        if more && let Some((last, _)) = items.last() {
            metadata["continue"] = json!(Page::token(page.version, last));
        }
        let items: Vec<&Value> = items.into_iter().map(|(_, object)| object).collect();
        let list = json!({
            "kind": format!("{}List", kind.name()),
            "apiVersion": kind.api_version(),
            "metadata": metadata,
            "items": items,
        });
        return (json_type, list.to_string()).into_response();
    }
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    *stub.lock().watches.entry(kind).or_default() += 1;
    let events = futures::stream::unfold((stub, from), move |(stub, mut seen)| async move {
        loop {
            let changed = stub.changed.clone();
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Events are in resourceVersion order: the search starts
            // after what this watch has seen (a cluster of the scale
            // harness's size has hundreds of thousands).
            let next = {
                let state = stub.lock();
                let after = state
                    .events
                    .partition_point(|(version, ..)| *version <= seen);
                state.events[after..]
                    .iter()
                    .find(|(_, k, _)| *k == kind)
                    .map(|(version, _, event)| (*version, event.clone()))
            };
            if let Some((version, event)) = next {
                seen = version;
                return Some((Ok::<_, Infallible>(format!("{event}\n")), (stub, seen)));
            }
            notified.await;
        }
    });
    (json_type, axum::body::Body::from_stream(events)).into_response()
}

/// One page of a list, as kube-apiserver serves them: `limit` objects at
/// most (kube's watcher asks for 500), the next page's `continue` token
/// naming the list's resourceVersion and the last key served, every page
/// reporting the first one's resourceVersion. Unpaged, the stub answered
/// the scale harness's 150,000 pods in one 80 MB response, which the agent
/// buffered twice: no API server does that.
struct Page {
    limit: usize,
    version: u64,
    after: Option<String>,
}

impl Page {
    fn of(query: &HashMap<&str, &str>, current: u64) -> Self {
        let limit = query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|&l: &usize| l > 0)
            .unwrap_or(usize::MAX);
        let resumed = query.get("continue").and_then(|token| Page::parse(token));
        let (version, after) = match resumed {
            Some((version, after)) => (version, Some(after)),
            None => (current, None),
        };
        Page {
            limit,
            version,
            after,
        }
    }

    /// `<version>x<key in hex>`: letters and digits only, so the token
    /// needs no escaping in the query.
    fn token(version: u64, last: &str) -> String {
        let hex: String = last.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{version}x{hex}")
    }

    fn parse(token: &str) -> Option<(u64, String)> {
        let (version, hex) = token.split_once('x')?;
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        Some((version.parse().ok()?, String::from_utf8(bytes?).ok()?))
    }
}

/// The stub served on `listener` (already bound, in whichever network
/// namespace it was made) on a thread of its own, until dropped.
pub struct ServedStub {
    pub stub: ApiStub,
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServedStub {
    /// The recorded nodes served on `listener`.
    pub fn start(listener: TcpListener) -> Self {
        Self::serve(ApiStub::from_fixture(), listener)
    }

    /// The recorded nodes served on the loopback of `netns` (a simulated
    /// node's, where its agent runs).
    pub fn start_in(netns: &crate::Netns) -> Self {
        Self::serve_in(ApiStub::from_fixture(), netns)
    }

    /// `stub` served on the loopback of `netns`.
    pub fn serve_in(stub: ApiStub, netns: &crate::Netns) -> Self {
        let listener = netns
            .run(|| TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)))
            .expect("a loopback listener in the namespace");
        Self::serve(stub, listener)
    }

    pub fn serve(stub: ApiStub, listener: TcpListener) -> Self {
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = stub.router();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                tokio::select! {
                    served = axum::serve(listener, router) => served.expect("serving"),
                    _ = stopped => {}
                }
            });
        });
        ServedStub {
            stub,
            url,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ServedStub {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A Namespace as the API serves it: `labels` and the
/// `kubernetes.io/metadata.name` label the API server adds to every one.
pub fn api_namespace(name: &str, labels: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/metadata.name"] = json!(name);
    json!({"metadata": {"name": name, "labels": labels}})
}

/// A Running pod of `node` at `ip` as the API serves it: `labels` on it,
/// `containers` (their ports, named or not) in its spec.
/// A Running pod labelled `app: <app>`, one busybox container, no ports.
pub fn api_app_pod(
    namespace: &str,
    name: &str,
    node: &str,
    ip: std::net::IpAddr,
    app: &str,
) -> Value {
    let containers = json!([{"name": "c", "image": "busybox"}]);
    api_pod(namespace, name, node, ip, json!({"app": app}), containers)
}

pub fn api_pod(
    namespace: &str,
    name: &str,
    node: &str,
    ip: std::net::IpAddr,
    labels: Value,
    containers: Value,
) -> Value {
    json!({
        "metadata": {"namespace": namespace, "name": name,
                     "uid": format!("uid-{namespace}-{name}"), "labels": labels},
        "spec": {"nodeName": node, "containers": containers},
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}
    })
}

/// The value of the sample `series` (name and labels, as rendered) on an
/// agent's /metrics page; None when it is not there.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_token_reads_back_as_the_version_and_key_it_names() {
        let token = Page::token(42, "kube-system/coredns-5d78c9869d-x7k2p");
        assert!(token.chars().all(|c| c.is_ascii_alphanumeric()), "{token}");
        assert_eq!(
            Page::parse(&token),
            Some((42, "kube-system/coredns-5d78c9869d-x7k2p".to_string()))
        );
        assert_eq!(Page::parse("42xzz"), None);
        let query = HashMap::from([("limit", "500"), ("continue", token.as_str())]);
        let page = Page::of(&query, 99);
        assert_eq!((page.limit, page.version), (500, 42));
        assert_eq!(
            page.after.as_deref(),
            Some("kube-system/coredns-5d78c9869d-x7k2p")
        );
        let first = Page::of(&HashMap::from([("limit", "500")]), 99);
        assert_eq!((first.version, first.after), (99, None));
    }
}

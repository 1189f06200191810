//! `kube_watch::run` against a stub of the API server: its core/v1 services
//! and discovery.k8s.io/v1 endpointslices collections on 127.0.0.1 (list,
//! then a watch stream fed by the test). Loopback only.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use flatnet_cluster_dns::{ClusterSnapshot, ZoneConfig, kube_watch};
use hickory_net::proto::op::ResponseCode;
use hickory_net::proto::rr::{DNSClass, Name, RData, RecordType};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One collection: what a list returns, and the events its (first) watch
/// streams as the test sends them.
struct Collection {
    list: Value,
    events: Mutex<Option<mpsc::UnboundedReceiver<Value>>>,
}

type Stub = Arc<HashMap<&'static str, Collection>>;

async fn collection(kind: &'static str, stub: Stub, query: Option<String>) -> Response {
    let json_type = [(header::CONTENT_TYPE, "application/json")];
    let collection = &stub[kind];
    let watching = query
        .unwrap_or_default()
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    if !watching {
        return (json_type, collection.list.to_string()).into_response();
    }
    // The first watch gets the test's events; a later one (none is
    // expected) waits forever.
    let receiver = collection.events.lock().unwrap().take();
    let lines = futures::stream::unfold(receiver, |receiver| async move {
        match receiver {
            Some(mut events) => {
                let event = events.recv().await?;
                Some((Ok::<_, Infallible>(format!("{event}\n")), Some(events)))
            }
            None => std::future::pending().await,
        }
    });
    (json_type, axum::body::Body::from_stream(lines)).into_response()
}

fn web_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"namespace": "demo", "name": "web", "resourceVersion": "5"},
           "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
}

fn db_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"namespace": "demo", "name": "db", "resourceVersion": "6"},
           "spec": {"clusterIP": "None", "clusterIPs": ["None"],
                    "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}})
}

/// One of db's slices: `endpoints` as (address, hostname, ready).
fn db_slice(name: &str, version: &str, endpoints: &[(&str, &str, bool)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(address, hostname, ready)| {
            json!({"addresses": [address], "hostname": hostname,
                   "conditions": {"ready": ready}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"namespace": "demo", "name": name, "resourceVersion": version,
                        "labels": {"kubernetes.io/service-name": "db"}},
           "addressType": "IPv4",
           "endpoints": endpoints,
           "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]})
}

fn list(api_version: &str, kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": "10"}, "items": items})
}

fn addresses(snapshot: &ClusterSnapshot, name: &str, qtype: RecordType) -> Option<Vec<IpAddr>> {
    let answer = snapshot.answer(&Name::from_ascii(name).unwrap(), qtype, DNSClass::IN);
    (answer.response_code == ResponseCode::NoError).then(|| {
        answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect()
    })
}

/// Waits until the newest snapshot satisfies `done`.
async fn wait_for(
    snapshots: &mut watch::Receiver<Arc<ClusterSnapshot>>,
    done: impl Fn(&ClusterSnapshot) -> bool,
) {
    tokio::time::timeout(TIMEOUT, snapshots.wait_for(|s| done(s)))
        .await
        .expect("the snapshot did not come in time")
        .expect("the watches ended");
}

#[tokio::test]
async fn services_and_endpoint_slices_become_snapshots() {
    let (service_events, service_receiver) = mpsc::unbounded_channel();
    let (slice_events, slice_receiver) = mpsc::unbounded_channel();
    let stub: Stub = Arc::new(HashMap::from([
        (
            "services",
            Collection {
                list: list("v1", "Service", vec![web_service(), db_service()]),
                events: Mutex::new(Some(service_receiver)),
            },
        ),
        (
            "endpointslices",
            Collection {
                list: list(
                    "discovery.k8s.io/v1",
                    "EndpointSlice",
                    vec![db_slice("db-a", "7", &[("10.244.1.7", "db-0", true)])],
                ),
                events: Mutex::new(Some(slice_receiver)),
            },
        ),
    ]));
    let router = axum::Router::new()
        .route(
            "/api/v1/services",
            get(|State(stub): State<Stub>, RawQuery(query): RawQuery| {
                collection("services", stub, query)
            }),
        )
        .route(
            "/apis/discovery.k8s.io/v1/endpointslices",
            get(|State(stub): State<Stub>, RawQuery(query): RawQuery| {
                collection("endpointslices", stub, query)
            }),
        )
        .with_state(stub);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let config = ZoneConfig::new("cluster.local", 5).unwrap();
    let (sender, mut snapshots) =
        watch::channel(Arc::new(ClusterSnapshot::unsynced(config.clone())));
    let watching = tokio::spawn(kube_watch::run(client, config, sender));

    // Both lists in: synced, with what they hold.
    wait_for(&mut snapshots, ClusterSnapshot::is_synced).await;
    let snapshot = snapshots.borrow().clone();
    let ip = |text: &str| text.parse::<IpAddr>().unwrap();
    assert_eq!(
        addresses(&snapshot, "web.demo.svc.cluster.local.", RecordType::A),
        Some(vec![ip("10.96.0.20")])
    );
    assert_eq!(
        addresses(&snapshot, "db-0.db.demo.svc.cluster.local.", RecordType::A),
        Some(vec![ip("10.244.1.7")])
    );

    // A watch event: a new service appears in the next snapshot.
    service_events
        .send(json!({"type": "ADDED", "object": {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "demo", "name": "added", "resourceVersion": "11"},
            "spec": {"clusterIP": "10.96.0.42", "clusterIPs": ["10.96.0.42"], "ports": [{"port": 80}]}}}))
        .unwrap();
    wait_for(&mut snapshots, |s| {
        addresses(s, "added.demo.svc.cluster.local.", RecordType::A).is_some()
    })
    .await;

    // A second slice of db: its endpoints join the first's; one that
    // turns not ready leaves.
    slice_events
        .send(json!({"type": "ADDED", "object": db_slice(
            "db-b", "12", &[("10.244.2.8", "db-1", true)])}))
        .unwrap();
    wait_for(&mut snapshots, |s| {
        addresses(s, "db.demo.svc.cluster.local.", RecordType::A)
            == Some(vec![ip("10.244.1.7"), ip("10.244.2.8")])
    })
    .await;
    slice_events
        .send(json!({"type": "MODIFIED", "object": db_slice(
            "db-a", "13", &[("10.244.1.7", "db-0", false)])}))
        .unwrap();
    wait_for(&mut snapshots, |s| {
        addresses(s, "db.demo.svc.cluster.local.", RecordType::A) == Some(vec![ip("10.244.2.8")])
            && addresses(s, "db-0.db.demo.svc.cluster.local.", RecordType::A).is_none()
    })
    .await;

    // And a deletion takes one away.
    service_events
        .send(json!({"type": "DELETED", "object": web_service()}))
        .unwrap();
    wait_for(&mut snapshots, |s| {
        addresses(s, "web.demo.svc.cluster.local.", RecordType::A).is_none()
    })
    .await;
    assert!(!watching.is_finished());
    watching.abort();
}

//! The real server on 127.0.0.1 (an ephemeral port, UDP and TCP), fed
//! snapshots through its channel instead of an API server, queried with
//! hickory's client. Loopback only.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use flatnet_cluster_dns::{ClusterSnapshot, DnsServer, ZoneConfig, health};
use hickory_net::client::Client;
use hickory_net::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_net::proto::rr::{Name, RData, Record, RecordType};
use hickory_net::runtime::TokioRuntimeProvider;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use tokio::sync::watch;
use tower::ServiceExt;

use common::{TIMEOUT, query, tcp_client, udp_client};

/// Endpoints of the big headless service (one EndpointSlice): more A records than fit 512
/// bytes (or EDNS's 1232) over UDP.
const MANY: usize = 100;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).unwrap()
}

fn cluster(extra_service: Option<&str>) -> ClusterSnapshot {
    let mut services = vec![
        service(json!({
            "metadata": {"namespace": "default", "name": "kubernetes"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}
        })),
        service(json!({
            "metadata": {"namespace": "demo", "name": "many"},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        })),
    ];
    if let Some(name) = extra_service {
        services.push(service(json!({
            "metadata": {"namespace": "demo", "name": name},
            "spec": {"clusterIP": "10.96.0.42", "ports": [{"port": 80}]}
        })));
    }
    let endpoints: Vec<serde_json::Value> = (0..MANY)
        .map(|i| {
            json!({"addresses": [format!("10.244.{}.{}", i / 200, i % 200 + 1)],
                   "conditions": {"ready": true}})
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "demo", "name": "many-abcde",
                     "labels": {"kubernetes.io/service-name": "many"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]
    }))
    .unwrap();
    let config = ZoneConfig::new("cluster.local", 5).unwrap();
    ClusterSnapshot::build(config, services.iter(), [slice].iter(), 1)
}

type Snapshots = watch::Sender<Arc<ClusterSnapshot>>;

async fn start(snapshot: ClusterSnapshot) -> (DnsServer, Snapshots) {
    let (sender, receiver) = watch::channel(Arc::new(snapshot));
    let listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = DnsServer::bind(listen, receiver).await.unwrap();
    assert!(server.local_addr().ip().is_loopback());
    assert_ne!(server.local_addr().port(), 0);
    (server, sender)
}

fn addresses(records: &[Record]) -> Vec<IpAddr> {
    records
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
            _ => None,
        })
        .collect()
}

/// The same questions, over UDP and over TCP.
async fn check_answers(client: &mut Client<TokioRuntimeProvider>) {
    let found = query(
        client,
        "Kubernetes.Default.svc.cluster.local.",
        RecordType::A,
    )
    .await;
    assert_eq!(found.metadata.response_code, ResponseCode::NoError);
    assert!(found.metadata.authoritative);
    assert!(!found.metadata.recursion_available);
    assert_eq!(
        addresses(&found.answers),
        ["10.96.0.1".parse::<IpAddr>().unwrap()]
    );

    let srv = query(
        client,
        "_https._tcp.kubernetes.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .await;
    assert_eq!(srv.answers.len(), 1);
    // The target's address in the additional section.
    assert_eq!(
        addresses(&srv.additionals),
        ["10.96.0.1".parse::<IpAddr>().unwrap()]
    );

    let missing = query(client, "nope.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
    assert!(missing.answers.is_empty());
    assert!(matches!(missing.authorities[0].data, RData::SOA(_)));

    let nodata = query(
        client,
        "kubernetes.default.svc.cluster.local.",
        RecordType::TXT,
    )
    .await;
    assert_eq!(nodata.metadata.response_code, ResponseCode::NoError);
    assert!(nodata.answers.is_empty());
    assert!(matches!(nodata.authorities[0].data, RData::SOA(_)));

    let outside = query(client, "example.com.", RecordType::A).await;
    assert_eq!(outside.metadata.response_code, ResponseCode::Refused);
    assert!(outside.answers.is_empty());
}

#[tokio::test]
async fn answers_over_udp_and_tcp() {
    let (server, _snapshots) = start(cluster(None)).await;
    let address = server.local_addr();
    tokio::spawn(server.run());
    check_answers(&mut udp_client(address)).await;
    check_answers(&mut tcp_client(address).await).await;
}

#[tokio::test]
async fn a_large_answer_is_truncated_over_udp_and_whole_over_tcp() {
    let (server, _snapshots) = start(cluster(None)).await;
    let address = server.local_addr();
    tokio::spawn(server.run());
    let many = "many.demo.svc.cluster.local.";

    // Without EDNS a UDP response is at most 512 bytes.
    let mut plain = udp_client(address);
    plain.disable_edns();
    let truncated = query(&mut plain, many, RecordType::A).await;
    assert!(truncated.metadata.truncation);
    assert!(truncated.answers.len() < MANY);
    assert!(truncated.edns.is_none());

    // With EDNS, at most the offered 1232 bytes: still too small.
    let edns_truncated = query(&mut udp_client(address), many, RecordType::A).await;
    assert!(edns_truncated.metadata.truncation);
    assert!(edns_truncated.answers.len() < MANY);
    let edns = edns_truncated
        .edns
        .as_ref()
        .expect("an OPT record in the response");
    assert_eq!(edns.max_payload(), 1232);

    // TCP carries it all.
    let whole = query(&mut tcp_client(address).await, many, RecordType::A).await;
    assert!(!whole.metadata.truncation);
    assert_eq!(whole.answers.len(), MANY);
}

#[tokio::test]
async fn a_new_snapshot_on_the_channel_is_served_at_once() {
    let config = ZoneConfig::new("cluster.local", 5).unwrap();
    let (server, snapshots) = start(ClusterSnapshot::unsynced(config)).await;
    let address = server.local_addr();
    tokio::spawn(server.run());
    let mut client = udp_client(address);
    let added = "added.demo.svc.cluster.local.";

    // Before the first lists: SERVFAIL, so clients retry.
    let unsynced = query(&mut client, added, RecordType::A).await;
    assert_eq!(unsynced.metadata.response_code, ResponseCode::ServFail);

    snapshots.send(Arc::new(cluster(None))).unwrap();
    let absent = query(&mut client, added, RecordType::A).await;
    assert_eq!(absent.metadata.response_code, ResponseCode::NXDomain);

    snapshots.send(Arc::new(cluster(Some("added")))).unwrap();
    let present = query(&mut client, added, RecordType::A).await;
    assert_eq!(
        addresses(&present.answers),
        ["10.96.0.42".parse::<IpAddr>().unwrap()]
    );
}

/// A request with EDNS version 1, sent as raw bytes over UDP: BADVERS.
#[tokio::test]
async fn an_unknown_edns_version_gets_badvers() {
    let (server, _snapshots) = start(cluster(None)).await;
    let address = server.local_addr();
    tokio::spawn(server.run());

    let mut request = Message::query();
    request.metadata.id = 4242;
    request.metadata.op_code = OpCode::Query;
    request.add_query(Query::query(
        Name::from_str("kubernetes.default.svc.cluster.local.").unwrap(),
        RecordType::A,
    ));
    let mut edns = Edns::new();
    edns.set_version(1);
    request.edns = Some(edns);

    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket
        .send_to(&request.to_vec().unwrap(), address)
        .await
        .unwrap();
    let mut buffer = [0u8; 4096];
    let (length, _) = tokio::time::timeout(TIMEOUT, socket.recv_from(&mut buffer))
        .await
        .unwrap()
        .unwrap();
    let response = Message::from_vec(&buffer[..length]).unwrap();
    assert_eq!(response.metadata.id, 4242);
    assert_eq!(response.metadata.message_type, MessageType::Response);
    // 16 (BADVERS, RFC 6891), split between the header and the OPT
    // record; it reads back as BADSIG, which shares the number.
    assert_eq!(
        u16::from(response.metadata.response_code),
        u16::from(ResponseCode::BADVERS)
    );
    assert!(response.answers.is_empty());
}

#[tokio::test]
async fn the_probes_follow_the_snapshot() {
    let config = ZoneConfig::new("cluster.local", 5).unwrap();
    let (snapshots, receiver) = watch::channel(Arc::new(ClusterSnapshot::unsynced(config)));
    let status = |path: &'static str| {
        let router = health::router(receiver.clone());
        async move {
            let request = Request::get(path).body(Body::empty()).unwrap();
            router.oneshot(request).await.unwrap().status()
        }
    };
    assert_eq!(status("/health").await, StatusCode::OK);
    assert_eq!(status("/ready").await, StatusCode::SERVICE_UNAVAILABLE);
    snapshots.send(Arc::new(cluster(None))).unwrap();
    assert_eq!(status("/health").await, StatusCode::OK);
    assert_eq!(status("/ready").await, StatusCode::OK);
    assert_eq!(status("/metrics").await, StatusCode::NOT_FOUND);
}

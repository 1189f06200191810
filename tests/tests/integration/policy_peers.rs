//! A node's policy state grows with pods plus rules: 16 pods here that a
//! policy opens to a namespace of 5,000 pods on another node hold one
//! identity entry each and the node one address entry per client (the
//! per-address layout needed 80,000 entries, more than the node's 65,536,
//! and a client that came later reached none of the 16). One simulated
//! node, its agent on the API stub, the 16 servers and a late client real
//! pods made through the plugin. (A map that is full after all:
//! `map_sizes`.)

use std::net::{IpAddr, Ipv4Addr};

use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{Kind, ServedStub, api_app_pod, api_namespace, metric};
use flatnet_tests::*;
use serde_json::{Value, json};

const NODE: &str = "cp-1";
const SERVERS: usize = 16;
const CLIENTS: usize = 5_000;

/// Client `i` on worker-1: every other address of 10.245.0.0/16, as a
/// namespace's pods are spread over a node's range.
fn synthetic_client(i: usize) -> Value {
    let n = 2 * i + 2;
    let ip = IpAddr::V4(Ipv4Addr::new(10, 245, (n / 256) as u8, (n % 256) as u8));
    api_app_pod("clients", &format!("client-{i}"), "worker-1", ip, "client")
}

#[flatnet_test(root)]
fn sixteen_pods_open_to_a_namespace_of_5000_pods_fit_and_a_late_client_reaches_them() {
    let cluster = Cluster::new(&specs(&[(NODE, 1, Some("10.244.0.0/24"))]));
    let node = cluster.node(NODE);
    let served = ServedStub::start_in(&node.netns);
    let stub = &served.stub;
    stub.add(Kind::Namespace, api_namespace("app", json!({})));
    stub.add(
        Kind::Namespace,
        api_namespace("clients", json!({"role": "clients"})),
    );
    for i in 0..CLIENTS {
        stub.add(Kind::Pod, synthetic_client(i));
    }
    stub.add(
        Kind::NetworkPolicy,
        json!({"metadata": {"namespace": "app", "name": "from-clients"},
               "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"role": "clients"}}}]}]}}),
    );
    node.start_agent(&Peers::Api(served.url.clone()));
    node.wait_ready();
    let servers: Vec<_> = (0..SERVERS).map(|_| node.pod()).collect();
    for (i, pod) in servers.iter().enumerate() {
        let ip = IpAddr::V4(pod.ip);
        stub.add(
            Kind::Pod,
            api_app_pod("app", &format!("server-{i}"), NODE, ip, "server"),
        );
    }
    let gauge = |name: &str| metric(&node.metrics(), name).unwrap_or(-1.0);
    wait_until(
        "the servers isolated, the clients' addresses written",
        SETTLE,
        || {
            gauge("flatnet_policy_isolated_pods{direction=\"ingress\"}") == SERVERS as f64
                && gauge("flatnet_policy_peer_addresses") == CLIENTS as f64
        },
    );
    assert_eq!(
        gauge("flatnet_policy_identities"),
        1.0,
        "one Deployment, one identity"
    );

    // A client that comes later, a real pod on this node.
    let late = node.pod();
    stub.add(
        Kind::Pod,
        api_app_pod("clients", "late", NODE, IpAddr::V4(late.ip), "client"),
    );
    wait_until("the late client's address written", SETTLE, || {
        gauge("flatnet_policy_peer_addresses") == (CLIENTS + 1) as f64
    });
    for server in &servers {
        tcp_echo(Some(&server.netns), server.ip, Some(&late.netns), 1 << 10)
            .unwrap_or_else(|e| panic!("the late client to {}: {e}", server.ip));
    }
    // And what the datapath holds: one identity entry per server, no
    // prefix, one address per client.
    let datapath = node.datapath();
    let mut by_prefix = 0;
    let mut by_identity = 0;
    for server in &servers {
        let slot = datapath
            .slot_of(IpAddr::V4(server.ip))
            .unwrap()
            .expect("a server's slot");
        by_prefix += datapath.pod_policy_rules(slot).unwrap().len();
        by_identity += datapath.pod_policy_peers(slot).unwrap().len();
    }
    assert_eq!((by_prefix, by_identity), (0, SERVERS));
    assert_eq!(datapath.peer_ids().unwrap().len(), CLIENTS + 1);
    assert_eq!(gauge("flatnet_policy_errors_total"), 0.0);
    let pressure = gauge("flatnet_bpf_map_pressure{map=\"PEER_IDS_V4\"}");
    let expected = (CLIENTS + 1) as f64 / f64::from(flatnet_common::MAX_PEER_IDS);
    assert!(
        (pressure - expected).abs() < 1e-9,
        "PEER_IDS_V4 pressure {pressure}"
    );
    println!(
        "{SERVERS} servers open to {CLIENTS} clients: {by_identity} identity entries, {} peer addresses",
        CLIENTS + 1
    );
    node.stop_agent();
    drop((servers, late));
    drop(served);
}

//! The agent against a stub of the Kubernetes API server (kube_stub.rs):
//! the Kubernetes peer source follows Nodes, the agent routes them, and it
//! computes and writes NetworkPolicy from the API's objects.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::time::Duration;

use flatnet_agent::peers::kube_source::KubeSource;
use flatnet_agent::peers::{Node, PeerSource};
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{Kind, ServedStub, api_namespace, api_pod, metric};
use flatnet_tests::*;
use serde_json::{Value, json};

fn names_and_cidrs(nodes: &[Node]) -> Vec<String> {
    let mut view: Vec<String> = nodes
        .iter()
        .map(|n| {
            let cidrs: Vec<String> = n.pod_cidrs.iter().map(|c| c.to_string()).collect();
            let addresses: Vec<String> = n.addresses.iter().map(|a| a.to_string()).collect();
            format!(
                "{} [{}] via [{}]",
                n.name,
                cidrs.join(","),
                addresses.join(",")
            )
        })
        .collect();
    view.sort();
    view
}

#[flatnet_test]
fn the_kubernetes_source_follows_nodes_from_the_api_server() {
    // No root needed: the stub listens on 127.0.0.1 of this namespace.
    let served = ServedStub::start(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap());
    let stub = served.stub.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut source = KubeSource::for_api_server(&served.url).expect("client");
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(15), source.changed())
                .await
                .expect("no node list within 15 s")
                .expect("source error")
        };
        // The initial list: worker-2 has joined but has no pod CIDR yet.
        assert_eq!(
            names_and_cidrs(&next().await),
            [
                "cp-1 [10.244.0.0/24] via [172.30.0.1]",
                "worker-1 [10.244.1.0/24] via [172.30.0.2]",
                "worker-2 [] via [172.30.0.3]",
            ]
        );
        // kube-controller-manager allocates worker-2's CIDR. (The watch
        // starts from the list's resourceVersion: the stub replays what
        // happened since, as the API server does.)
        stub.modify(Kind::Node, "worker-2", |node| {
            node["spec"]["podCIDR"] = json!("10.244.2.0/24");
            node["spec"]["podCIDRs"] = json!(["10.244.2.0/24"]);
        });
        assert!(
            names_and_cidrs(&next().await)
                .contains(&"worker-2 [10.244.2.0/24] via [172.30.0.3]".to_string())
        );
        // Heartbeats change nothing the agent cares about: no new list.
        stub.modify(Kind::Node, "cp-1", |node| {
            node["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2025-03-02T09:41:12Z");
        });
        // worker-1 is deleted.
        stub.delete(Kind::Node, "worker-1");
        assert_eq!(
            names_and_cidrs(&next().await),
            [
                "cp-1 [10.244.0.0/24] via [172.30.0.1]",
                "worker-2 [10.244.2.0/24] via [172.30.0.3]",
            ]
        );
    });
    assert_eq!(stub.lists(Kind::Node), 1, "one list, then the watch");
    assert!(stub.watches(Kind::Node) >= 1);
}

#[flatnet_test(root)]
fn the_agent_routes_nodes_from_the_kubernetes_api() {
    // This node is the fixture's cp-1 (172.30.0.1, pod CIDR 10.244.0.0/24).
    let cluster = Cluster::new(&specs(&[("cp-1", 1, Some("10.244.0.0/24"))]));
    let node = cluster.node("cp-1");
    // The stub listens on the node's own loopback, where the agent runs.
    let served = ServedStub::start_in(&node.netns);
    node.start_agent(&Peers::Api(served.url.clone()));
    node.wait_ready();
    let ipam = &node.conflist()["plugins"][0]["ipam"]["ranges"][0][0];
    assert_eq!(ipam["subnet"], "10.244.0.0/24");
    assert_eq!(ipam["gateway"], "10.244.0.1");
    let worker_1 = "10.244.1.0/24 via 172.30.0.2".to_string();
    wait_until("worker-1's route", SETTLE, || {
        node.routes() == [worker_1.clone()]
    });

    served.stub.modify(Kind::Node, "worker-2", |n| {
        n["spec"]["podCIDRs"] = json!(["10.244.2.0/24"]);
    });
    let worker_2 = "10.244.2.0/24 via 172.30.0.3".to_string();
    // Routes and the fast path's CIDR map are written one after the other
    // in the same pass: wait for both (CI once read the map in between).
    wait_until("worker-2's late route and map entry", SETTLE, || {
        node.routes() == [worker_1.clone(), worker_2.clone()]
            && node.remote_cidrs() == [worker_1.clone(), worker_2.clone()]
    });

    served.stub.delete(Kind::Node, "worker-1");
    wait_until("worker-1's route and map entry to go", SETTLE, || {
        node.routes() == [worker_2.clone()]
            && node.remote_cidrs() == std::slice::from_ref(&worker_2)
    });

    // A pod on this node gets its address from the node's CIDR.
    let pod = node.pod();
    assert!(
        IpAddr::V4(pod.ip).to_string().starts_with("10.244.0."),
        "{}",
        pod.ip
    );
    drop(pod);
    // The node's last pod is gone, but the agent's datapath stays pinned
    // (the next ADD must not load it) and STATUS still answers ready.
    assert!(node.datapath().is_loaded(flatnet::config::DatapathMode::Tc));
    assert!(node.cni("STATUS", None).success());
    node.stop_agent();
    drop(served);
}

/// A Running pod of `node` in the API, labelled `labels`, at `ip`, serving
/// `http` on TCP 80.
fn http_pod(namespace: &str, name: &str, node: &str, ip: IpAddr, labels: Value) -> Value {
    let containers = json!([{"name": "c", "image": "busybox",
        "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}]}]);
    api_pod(namespace, name, node, ip, labels, containers)
}

#[flatnet_test(root)]
fn the_agent_computes_and_writes_network_policy_from_the_kubernetes_api() {
    let began = std::time::Instant::now();
    let cluster = Cluster::new(&specs(&[("cp-1", 1, Some("10.244.0.0/24"))]));
    let node = cluster.node("cp-1");
    let served = ServedStub::start_in(&node.netns);
    let stub = &served.stub;
    stub.add(
        Kind::Namespace,
        api_namespace("shop", json!({"env": "prod"})),
    );
    stub.add(
        Kind::Namespace,
        api_namespace("tools", json!({"env": "dev"})),
    );
    node.start_agent(&Peers::Api(served.url.clone()));
    node.wait_ready();

    // Two real pods on the node, as the API lists them once kubelet
    // reported their IPs; a pod of another node is a peer only.
    let web = node.pod();
    let client = node.pod();
    let (web_ip, client_ip) = (IpAddr::V4(web.ip), IpAddr::V4(client.ip));
    stub.add(
        Kind::Pod,
        http_pod("shop", "web", "cp-1", web_ip, json!({"app": "web"})),
    );
    stub.add(
        Kind::Pod,
        http_pod(
            "tools",
            "client",
            "cp-1",
            client_ip,
            json!({"app": "client"}),
        ),
    );
    let elsewhere: IpAddr = "10.244.1.7".parse().unwrap();
    stub.add(
        Kind::Pod,
        http_pod(
            "tools",
            "far",
            "worker-1",
            elsewhere,
            json!({"app": "client"}),
        ),
    );
    // Ingress to web: from the dev namespaces' clients, on its named port.
    stub.add(
        Kind::NetworkPolicy,
        json!({
            "metadata": {"namespace": "shop", "name": "web-from-tools"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{
                    "from": [{"namespaceSelector": {"matchLabels": {"env": "dev"}},
                              "podSelector": {"matchLabels": {"app": "client"}}}],
                    "ports": [{"port": "http"}]
                }]
            }
        }),
    );
    let isolated = |direction: &str| {
        metric(
            &node.metrics(),
            &format!("flatnet_policy_isolated_pods{{direction=\"{direction}\"}}"),
        )
    };
    let updates = || metric(&node.metrics(), "flatnet_policy_updates_total").unwrap_or(0.0);
    wait_until("web isolated for ingress", SETTLE, || {
        isolated("ingress") == Some(1.0) && isolated("egress") == Some(0.0)
    });
    // Written for web (isolated) and left alone for client (never isolated).
    wait_until("web's policy written", SETTLE, || updates() >= 1.0);
    let datapath = node.datapath();
    let slot = datapath.slot_of(web_ip).unwrap().expect("web's slot");
    // A pod's rules as "direction cidr ports": its prefixes, and the
    // addresses of each identity it allows as host prefixes.
    let written = |slot: u32| {
        let flags = datapath.pod_policy(slot).unwrap().flags;
        let mut rules: Vec<String> = datapath
            .pod_policy_rules(slot)
            .unwrap()
            .iter()
            .map(|(direction, rule)| format!("{direction} {} {:?}", rule.cidr, rule.ports))
            .collect();
        let ids = datapath.peer_ids().unwrap();
        for (direction, rule) in datapath.pod_policy_peers(slot).unwrap() {
            let members = ids.iter().filter(|(_, id)| **id == rule.identity);
            rules.extend(
                members.map(|(address, _)| format!("{direction} {address}/32 {:?}", rule.ports)),
            );
        }
        rules.sort();
        (flags, rules)
    };
    let (flags, rules) = written(slot);
    assert_eq!(flags, flatnet_common::POLICY_F_INGRESS);
    let allowed = |ip: IpAddr| {
        format!(
            "{} {ip}/32 Ranges([PolicyPortRange {{ protocol: 6, first: 80, last: 80 }}])",
            flatnet_common::POLICY_DIR_INGRESS
        )
    };
    assert_eq!(rules, [allowed(client_ip), allowed(elsewhere)]);
    let client_slot = datapath.slot_of(client_ip).unwrap().expect("client's slot");
    assert_eq!(written(client_slot), (0, vec![]));

    // An update: the policy now also isolates web's egress (to nothing),
    // and the far client left the dev namespaces' selection.
    let before = updates();
    stub.modify(Kind::NetworkPolicy, "shop/web-from-tools", |p| {
        p["spec"]["policyTypes"] = json!(["Ingress", "Egress"]);
    });
    stub.delete(Kind::Pod, "tools/far");
    wait_until("web isolated both ways", SETTLE, || {
        isolated("egress") == Some(1.0)
    });
    wait_until("web's policy rewritten", SETTLE, || {
        written(slot)
            == (
                flatnet_common::POLICY_F_INGRESS | flatnet_common::POLICY_F_EGRESS,
                vec![allowed(client_ip)],
            )
    });
    assert!(
        updates() > before,
        "flatnet_policy_updates_total did not grow"
    );
    let page = node.metrics();
    assert!(
        metric(&page, "flatnet_policy_compute_seconds_count").unwrap_or(0.0) >= 2.0,
        "{page}"
    );
    assert_eq!(
        metric(&page, "flatnet_policy_errors_total"),
        Some(0.0),
        "{page}"
    );
    let log = node.agent_log();
    assert!(log.contains("pod isolation changed"), "{log}");
    // The node's addresses reach the datapath at each pass.
    assert!(
        stub.lists(Kind::NetworkPolicy) >= 1
            && stub.lists(Kind::Pod) >= 1
            && stub.lists(Kind::Namespace) >= 1
    );

    // The policy goes: web is isolated no more, its maps are cleared.
    stub.delete(Kind::NetworkPolicy, "shop/web-from-tools");
    wait_until("web's policy taken away", SETTLE, || {
        isolated("ingress") == Some(0.0) && written(slot) == (0, vec![])
    });
    // Long enough for kube's own backoff, reset by each try's Init, to
    // have asked four times more.
    std::thread::sleep(std::time::Duration::from_secs(4));
    node.stop_agent();
    // No ClusterNetworkPolicy CRDs here: the agent asked for them once,
    // then once a minute.
    let asked = stub.not_served_requests(CLUSTER_NETWORK_POLICIES);
    let minutes = began.elapsed().as_secs() as usize / 60;
    assert!((1..=1 + minutes).contains(&asked), "asked {asked} times");
    drop((web, client));
    drop(served);
}

const CLUSTER_NETWORK_POLICIES: &str =
    "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies";

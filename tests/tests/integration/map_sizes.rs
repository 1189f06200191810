//! Maps sized for the node: the agent's `--map-size` reaches the plugin
//! through the conflist and the maps are made that size; a pinned map
//! keeps its size across a reload; and a policy map filled to its size by
//! real policy holds its pods closed and says so, until it fits again.

use std::net::{IpAddr, Ipv4Addr};

use flatnet::config::DatapathMode;
use flatnet_common::{MAP_FLOWS, MAP_POLICY_PEERS};
use flatnet_datapath::bpf::sizes::MapSizing;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{Kind, ServedStub, api_app_pod, api_namespace, metric};
use flatnet_tests::*;
use serde_json::json;

const NODE: &str = "cp-1";
/// `POLICY_PEERS` as the tests size it: a policy naming more identities
/// than this cannot be written for one pod.
const PEERS: u32 = 64;

#[flatnet_test(root)]
fn maps_are_made_the_size_the_conflist_says_and_pinned_ones_keep_theirs() {
    let flags = ["--map-size", "POLICY_PEERS=64,FLOWS=1024"];
    let cluster = Cluster::started(&Cluster::numbered(1, false), &flags);
    let node = cluster.node("n1");
    let conflist = std::fs::read_to_string(node.conflist_path()).unwrap();
    assert!(conflist.contains("\"mapSizes\""), "{conflist}");
    let datapath = node.datapath();
    assert_eq!(datapath.capacity(MAP_POLICY_PEERS).unwrap(), Some(64));
    assert_eq!(datapath.capacity(MAP_FLOWS).unwrap(), Some(1024));
    // `flatnet inspect` shows them.
    let flatnet = bin("flatnet");
    let mut command = node.netns.command(&[
        flatnet.to_str().unwrap(),
        "inspect",
        "--network",
        &node.network,
    ]);
    let inspect = run_ok(command.env("FLATNET_PIN_ROOT", &node.pin_root));
    assert!(inspect.contains("POLICY_PEERS 64"), "{inspect}");
    // The plugin, reading the conflist, works with them.
    let (a, b) = (node.pod(), node.pod());
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 12).expect("pod to pod");

    // Loaded again with other sizes (as an upgrade whose configuration
    // says otherwise would): the pinned maps are reused as they are,
    // entries and size.
    node.stop_agent();
    let other = MapSizing {
        overrides: [
            (MAP_POLICY_PEERS.to_string(), 128),
            (MAP_FLOWS.to_string(), 2048),
        ]
        .into(),
        ..MapSizing::default()
    };
    datapath
        .clone()
        .sized(&other)
        .load(DatapathMode::Tc)
        .expect("loading again");
    assert_eq!(datapath.capacity(MAP_POLICY_PEERS).unwrap(), Some(64));
    assert_eq!(datapath.capacity(MAP_FLOWS).unwrap(), Some(1024));
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 12).expect("pod to pod after the reload");
    drop((a, b));
}

#[flatnet_test(root)]
fn a_policy_map_filled_by_real_policy_holds_its_pod_closed_until_it_fits() {
    let mut cluster = Cluster::new(&specs(&[(NODE, 1, Some("10.244.0.0/24"))]));
    // Passes only on changes (see policy_peers: a try of the whole table
    // at each resync would make the closed pod's probe racy).
    cluster.nodes[0].agent_flags = vec![
        "--map-size".into(),
        format!("POLICY_PEERS={PEERS}"),
        "--resync-secs".into(),
        "600".into(),
    ];
    let node = cluster.node(NODE);
    let served = ServedStub::start_in(&node.netns);
    let stub = &served.stub;
    stub.add(Kind::Namespace, api_namespace("app", json!({})));
    // Clients of `PEERS + 8` apps on another node: as many identities.
    let apps: Vec<String> = (0..PEERS + 8).map(|i| format!("c-{i}")).collect();
    for (i, app) in apps.iter().enumerate() {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 245, 0, 2 + i as u8));
        stub.add(Kind::Pod, api_app_pod("app", app, "worker-1", ip, app));
    }
    // The server admits the first `n` apps.
    let admits = |n: usize| {
        json!({"metadata": {"namespace": "app", "name": "admit"},
               "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                        "ingress": [{"from": [{"podSelector": {"matchExpressions": [
                            {"key": "app", "operator": "In", "values": apps[..n]}]}}]}]}})
    };
    stub.add(Kind::NetworkPolicy, admits(8));
    node.start_agent(&Peers::Api(served.url.clone()));
    node.wait_ready();
    let (server, client) = (node.pod(), node.pod());
    stub.add(
        Kind::Pod,
        api_app_pod("app", "server", NODE, IpAddr::V4(server.ip), "server"),
    );
    stub.add(
        Kind::Pod,
        api_app_pod("app", "client", NODE, IpAddr::V4(client.ip), "c-0"),
    );
    let feature = || {
        metric(
            &node.metrics(),
            "flatnet_agent_feature_ready{feature=\"network_policy\"}",
        )
    };
    let pressure = || {
        metric(
            &node.metrics(),
            "flatnet_bpf_map_pressure{map=\"POLICY_PEERS\"}",
        )
    };
    let reaches = || tcp_echo(Some(&server.netns), server.ip, Some(&client.netns), 1 << 10).is_ok();
    wait_until("8 of 64 entries written", SETTLE, || {
        pressure() == Some(8.0 / f64::from(PEERS)) && feature() == Some(1.0)
    });
    assert!(reaches(), "the client, of an admitted app");

    // More identities than the map holds: the server is held closed.
    stub.modify(Kind::NetworkPolicy, "app/admit", |p| {
        *p = admits(apps.len())
    });
    wait_until("network policy reported down", SETTLE, || {
        feature() == Some(0.0)
    });
    assert!(
        !reaches(),
        "a pod whose policy does not fit let a client in"
    );
    let log = node.agent_log();
    assert!(log.contains("it is held closed"), "{log}");
    let marker = std::fs::read_to_string(node.ready_marker()).unwrap_or_default();
    assert!(
        marker.contains("held closed"),
        "the ready marker (CNI STATUS): {marker}"
    );
    let errors = metric(&node.metrics(), "flatnet_policy_errors_total").unwrap_or(0.0);
    assert!(errors >= 1.0, "flatnet_policy_errors_total {errors}");

    // Back within the map: written at the next pass, up again.
    stub.modify(Kind::NetworkPolicy, "app/admit", |p| {
        *p = admits(PEERS as usize)
    });
    wait_until("all 64 entries written", SETTLE, || {
        pressure() == Some(1.0) && feature() == Some(1.0)
    });
    assert!(reaches(), "the client after the policy fit again");
    node.stop_agent();
    drop((server, client));
    drop(served);
}

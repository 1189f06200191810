//! The peer file drives the nodes' routes (stale ones go at start), and a
//! peer route someone else holds is reported and kept out of the fast path.

use std::time::Duration;

use flatnet_tests::cluster::*;
use flatnet_tests::*;

#[flatnet_test(root)]
fn the_peer_file_drives_routes_and_stale_ones_go_at_start() {
    let cluster = Cluster::with_file_agents(3);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let all = specs(&[
        ("n1", 1, Some("10.244.1.0/24")),
        ("n2", 2, Some("10.244.2.0/24")),
        ("n3", 3, Some("10.244.3.0/24")),
    ]);
    let to_n3 = "10.244.3.0/24 via 172.30.0.3".to_string();
    assert!(n1.routes().contains(&to_n3));

    // n3 leaves the cluster: its routes and map entries go everywhere.
    cluster.write_peers(&all[..2]);
    for node in [n1, n2] {
        wait_until("n3's route to go", SETTLE, || {
            !node.routes().contains(&to_n3)
        });
        assert!(!node.remote_cidrs().contains(&to_n3));
    }
    assert_eq!(n1.routes(), ["10.244.2.0/24 via 172.30.0.2"]);

    // n3 comes back without a pod CIDR (a fresh node): still no route.
    let mut late = all.clone();
    late[2].pod_cidr = None;
    cluster.write_peers(&late);
    // Once n1's agent has read that list (it says it left n3 out)...
    wait_until("n1 to leave n3 out", SETTLE, || {
        n1.agent_log()
            .contains("node n3: no pod CIDR allocated yet")
    });
    assert_eq!(n1.routes(), ["10.244.2.0/24 via 172.30.0.2"]);
    // It gets one: the route appears.
    cluster.write_peers(&all);
    wait_until("n3's route to come back", SETTLE, || {
        n1.routes().contains(&to_n3)
    });
    wait_until("n3 in n1's fast-path map", SETTLE, || {
        n1.remote_cidrs().contains(&to_n3)
    });

    // n2 moves to another address: the route follows.
    let mut moved = all.clone();
    moved[1].index = 22;
    n2.netns
        .exec(&["ip", "addr", "add", "172.30.0.22/24", "dev", "up0"]);
    cluster.write_peers(&moved);
    wait_until("n2's route to follow its address", SETTLE, || {
        n1.routes()
            .contains(&"10.244.2.0/24 via 172.30.0.22".to_string())
    });
    // The fast-path entry follows it too (an entry changed in place).
    wait_until("n2's map entry to follow its address", SETTLE, || {
        n1.remote_cidrs()
            .contains(&"10.244.2.0/24 via 172.30.0.22".to_string())
    });
    assert!(
        !n1.remote_cidrs()
            .contains(&"10.244.2.0/24 via 172.30.0.2".to_string())
    );

    // A flatnet route a previous run left behind goes when the agent
    // starts; a route of someone else's stays.
    n1.stop_agent();
    n1.netns.exec(&[
        "ip",
        "route",
        "add",
        "10.99.0.0/24",
        "via",
        "172.30.0.9",
        "proto",
        ROUTE_PROTO,
    ]);
    n1.netns
        .exec(&["ip", "route", "add", "10.98.0.0/24", "via", "172.30.0.9"]);
    assert!(
        n1.routes()
            .contains(&"10.99.0.0/24 via 172.30.0.9".to_string())
    );
    n1.start_agent(&cluster.file());
    n1.wait_ready();
    wait_until("the stale route to go", SETTLE, || {
        !n1.routes()
            .contains(&"10.99.0.0/24 via 172.30.0.9".to_string())
    });
    let others = n1.netns.exec(&["ip", "route", "show", "10.98.0.0/24"]);
    assert!(others.contains("via 172.30.0.9"), "{others}");
}

#[flatnet_test(root)]
fn a_peer_route_someone_else_holds_is_reported_and_kept_out_of_the_fast_path() {
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let three = specs(&[
        ("n1", 1, Some("10.244.1.0/24")),
        ("n2", 2, Some("10.244.2.0/24")),
        ("n3", 3, Some("10.244.3.0/24")),
    ]);
    let to_n3 = "10.244.3.0/24 via 172.30.0.3".to_string();
    // An operator's route for n3's CIDR on n1, before n3 joins.
    n1.netns
        .exec(&["ip", "route", "add", "10.244.3.0/24", "via", "172.30.0.9"]);
    cluster.write_peers(&three);
    wait_until("n2 to route n3's pods", SETTLE, || {
        n2.routes().contains(&to_n3)
    });
    wait_until("n1 to report the route it cannot write", SETTLE, || {
        n1.metrics().contains("flatnet_peer_routes_missing 1")
    });
    // Two resyncs later: still ready, nothing counted as a failed write,
    // n3 not in n1's fast path (which would forward by the foreign route).
    // Fixed on purpose: what must not happen within two resyncs.
    std::thread::sleep(Duration::from_secs(5));
    let page = n1.metrics();
    for line in [
        "flatnet_agent_ready 1",
        "flatnet_peer_routes 2",
        "flatnet_peer_routes_missing 1",
        "flatnet_route_failures_total 0",
        "flatnet_remote_cidrs 1",
    ] {
        assert!(page.contains(line), "{line} missing in:\n{page}");
    }
    assert!(n1.ready_marker().exists());
    assert!(n1.cni("STATUS", None).success());
    assert!(
        !n1.remote_cidrs().contains(&to_n3),
        "{:?}",
        n1.remote_cidrs()
    );
    assert!(n2.remote_cidrs().contains(&to_n3));
    let kept = n1.netns.exec(&["ip", "route", "show", "10.244.3.0/24"]);
    assert!(kept.contains("via 172.30.0.9"), "{kept}");

    // The foreign route goes: flatnet's takes its place, in both.
    n1.netns.exec(&["ip", "route", "del", "10.244.3.0/24"]);
    wait_until("n1 to route n3's pods", SETTLE, || {
        n1.routes().contains(&to_n3) && n1.remote_cidrs().contains(&to_n3)
    });
    wait_until("the gauge to clear", SETTLE, || {
        n1.metrics().contains("flatnet_peer_routes_missing 0")
    });

    // Readiness is the node's own state at each pass: n1 out of the node
    // list is not ready (STATUS 50), back in it is ready again.
    cluster.write_peers(&[three[1].clone(), three[2].clone()]);
    wait_until("n1 to turn not ready", SETTLE, || {
        !n1.ready_marker().exists()
    });
    let status = n1.cni("STATUS", None);
    status.assert_error(50, "");
    assert!(n1.metrics().contains("flatnet_agent_ready 0"));
    assert!(n2.ready_marker().exists(), "n2's readiness is its own");
    cluster.write_peers(&three);
    wait_until("n1 to turn ready again", SETTLE, || {
        n1.ready_marker().exists()
    });
    assert!(n1.cni("STATUS", None).success());
}

/// Between full read-backs (every tenth re-check) the agent compares the
/// remote-CIDR tries with what it wrote: an entry deleted by hand is put
/// back at the next full read.
#[flatnet_test(root)]
fn a_remote_cidr_deleted_by_hand_is_written_again() {
    let cluster = Cluster::with_file_agents(2);
    let n1 = cluster.node("n1");
    let to_n2 = vec!["10.244.2.0/24 via 172.30.0.2".to_string()];
    assert_eq!(n1.remote_cidrs(), to_n2);
    n1.datapath()
        .remove_remote_cidrs(&["10.244.2.0/24".parse().unwrap()])
        .expect("deleting n2's entry");
    assert_eq!(n1.remote_cidrs(), Vec::<String>::new());
    // Ten re-checks at 2 s, and room for a loaded machine.
    wait_until("n2's entry to be written again", SETTLE * 2, || {
        n1.remote_cidrs() == to_n2
    });
}

/// What the tries were last made to hold stands for a read-back while
/// they are the same maps; a reloaded datapath's (new ids) are read.
#[flatnet_test(root)]
fn remote_cidrs_are_compared_with_what_was_written_until_the_maps_change() {
    use flatnet::config::DatapathMode;
    use flatnet_datapath::bpf::RemoteCidr;
    let entry = |cidr: &str, node: &str| RemoteCidr {
        cidr: cidr.parse().unwrap(),
        node: node.parse().unwrap(),
        tunnelled: false,
    };
    let wanted = [
        entry("10.244.2.0/24", "172.30.0.2"),
        entry("fd00:10:244:2::/64", "fd30::2"),
    ];
    let scratch = flatnet_tests::test_run::ScratchDatapath::load(DatapathMode::Tc)
        .expect("loading the datapath");
    let datapath = &scratch.datapath;
    let written = datapath.sync_remote_cidrs(&wanted, None).expect("writing");
    let held = |d: &flatnet_datapath::bpf::Datapath| {
        let mut held = d.remote_cidrs().expect("reading");
        held.sort_by_key(|e| e.cidr);
        held
    };
    assert_eq!(held(datapath), wanted);
    assert_eq!(datapath.peer_nodes().unwrap().len(), 2);
    datapath
        .remove_remote_cidrs(&[wanted[0].cidr])
        .expect("deleting");
    // Trusted: nothing is written for what it says is there.
    let written = datapath
        .sync_remote_cidrs(&wanted, Some(written))
        .expect("writing");
    assert_eq!(held(datapath), wanted[1..]);
    // Read back: put right.
    datapath.sync_remote_cidrs(&wanted, None).expect("writing");
    assert_eq!(held(datapath), wanted);
    // The datapath loaded anew: what was written is about other maps.
    datapath.remove_pins().expect("wiping the pins");
    datapath.load(DatapathMode::Tc).expect("reloading");
    assert_eq!(held(datapath), []);
    datapath
        .sync_remote_cidrs(&wanted, Some(written))
        .expect("writing");
    assert_eq!(held(datapath), wanted);
    assert_eq!(datapath.peer_nodes().unwrap().len(), 2);
}

//! Cross-node behaviour on a simulated cluster (the harness is
//! `flatnet_tests::cluster`): the fast path between nodes, the agent's peer
//! sources, fallbacks, restarts, ipMasq, uninstall, dual-stack and XDP.

use flatnet_harness::RecvThroughSignals;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flatnet_agent::peers::kube_source::KubeSource;
use flatnet_agent::peers::{Node, PeerSource};
use flatnet_common::{PROG_FROM_POD, PROG_FROM_UPLINK, action};
use flatnet_datapath::bpf::flow_key;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{Kind, ServedStub, api_namespace, api_pod, metric};
use flatnet_tests::*;
use serde_json::{Value, json};

#[flatnet_test(root)]
fn pods_on_three_nodes_talk_tcp_through_the_bpf_fast_path() {
    let cluster = Cluster::with_file_agents(3);
    let (n1, n2, n3) = (cluster.node("n1"), cluster.node("n2"), cluster.node("n3"));

    // What the agent put on each node.
    for node in [n1, n2, n3] {
        let list = node.conflist();
        let ranges = &list["plugins"][0]["ipam"]["ranges"][0][0];
        assert_eq!(ranges["subnet"], format!("10.244.{}.0/24", node.spec.index));
        assert_eq!(list["plugins"][0]["ipam"]["type"], "flatnet-ipam");
        for binary in ["flatnet", "flatnet-ipam"] {
            assert_eq!(
                std::fs::read(node.bin_dir().join(binary)).unwrap(),
                std::fs::read(bin(binary)).unwrap(),
                "{binary} was not installed on {}",
                node.spec.name
            );
        }
        let others: Vec<String> = [1, 2, 3]
            .into_iter()
            .filter(|i| *i != node.spec.index)
            .map(|i| format!("10.244.{i}.0/24 via 172.30.0.{i}"))
            .collect();
        assert_eq!(node.routes(), others, "routes of {}", node.spec.name);
        assert_eq!(
            node.remote_cidrs(),
            others,
            "fast-path map of {}",
            node.spec.name
        );
        let status = node.cni("STATUS", None);
        assert!(status.success(), "STATUS on a ready node: {status:?}");
    }

    let a = n1.pod();
    let b = n2.pod();
    let c = n3.pod();
    assert!(a.ip.to_string().starts_with("10.244.1."), "{}", a.ip);
    let before: Vec<(u64, u64, u64, u64)> = [n1, n2, n3]
        .iter()
        .map(|n| {
            (
                n.packets(action::TO_REMOTE_NODE),
                n.packets(action::FROM_UPLINK),
                n.packets(action::REMOTE_PASSED),
                n.forwarded(),
            )
        })
        .collect();

    const BYTES: usize = 4 << 20;
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), BYTES).expect("n1 -> n2");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), BYTES).expect("n2 -> n1");
    tcp_echo(Some(&a.netns), a.ip, Some(&c.netns), BYTES).expect("n3 -> n1");
    tcp_echo(Some(&c.netns), c.ip, Some(&b.netns), BYTES).expect("n2 -> n3");

    for (node, (to_remote, from_uplink, passed, forwarded)) in [n1, n2, n3].iter().zip(&before) {
        let sent = node.packets(action::TO_REMOTE_NODE) - to_remote;
        let received = node.packets(action::FROM_UPLINK) - from_uplink;
        let fell_back = node.packets(action::REMOTE_PASSED) - passed;
        let routed_by_stack = node.forwarded() - forwarded;
        eprintln!(
            "{}: to_remote_node {sent}, uplink_to_pod {received}, remote_passed_to_stack {fell_back}, stack forwarded {routed_by_stack}",
            node.spec.name
        );
        // Every node both sent and received at least one full transfer.
        assert!(
            sent > 100 && received > 100,
            "{}: fast path sent {sent}, uplink delivered {received}",
            node.spec.name
        );
        // The host stack routed (almost) nothing: the BPF path carried it.
        assert!(
            routed_by_stack + fell_back <= (sent + received) / 50,
            "{}: the stack forwarded {routed_by_stack} and {fell_back} fell back, against {} on the fast path",
            node.spec.name,
            sent + received
        );
    }

    let page = n1.metrics();
    let line = page
        .lines()
        .find(|l| l.starts_with("flatnet_datapath_packets_total{action=\"to_remote_node\"}"))
        .unwrap_or_else(|| panic!("no to_remote_node counter in:\n{page}"));
    let exported: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(exported > 100, "{line}");
    assert!(page.contains("flatnet_agent_ready 1"), "{page}");
    assert!(page.contains("flatnet_peer_routes 2"), "{page}");
    assert!(page.contains("flatnet_remote_cidrs 2"), "{page}");
}

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
fn what_the_fast_path_cannot_route_falls_back_to_the_host_stack() {
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let a = n1.pod();
    let b = n2.pod();
    // n1's uplink shrinks below the pods' MTU: a full-size datagram no
    // longer fits the way out, so the FIB lookup refuses it and the stack
    // must fragment it.
    n1.netns.exec(&["ip", "link", "set", "up0", "mtu", "1400"]);
    let (passed, forwarded) = (n1.packets(action::REMOTE_PASSED), n1.forwarded());
    // No DF bit: the node may fragment it, as routers do.
    udp_source(&a.netns, a.ip, &b.netns, b.ip, 1472);
    assert!(
        n1.packets(action::REMOTE_PASSED) > passed,
        "not handed to the stack"
    );
    assert!(n1.forwarded() > forwarded, "the stack did not route it");
    // Small packets still take the fast path.
    let fast = n1.packets(action::TO_REMOTE_NODE);
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1000).expect("n1 -> n2");
    assert!(n1.packets(action::TO_REMOTE_NODE) > fast);
}

/// The elements of `node`'s IPv4 no-masquerade set, as CIDRs; None when
/// the set does not exist.
fn no_masq_elements(node: &SimNode) -> Option<Vec<String>> {
    let set = flatnet_datapath::masquerade::no_masq_set(&node.network, true);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node.netns.name,
            "nft",
            "-j",
            "list",
            "set",
        ])
        .args(["inet", "flatnet", &set])
        .output()
        .expect("run nft");
    if !out.status.success() {
        return None;
    }
    let listing: Value = serde_json::from_slice(&out.stdout).expect("nft JSON");
    let elements = listing["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["set"]["elem"].as_array())
        .flatten()
        .map(|element| match element.as_str() {
            Some(address) => format!("{address}/32"),
            None => format!(
                "{}/{}",
                element["prefix"]["addr"].as_str().unwrap_or("?"),
                element["prefix"]["len"]
            ),
        })
        .collect();
    Some(elements)
}

/// True while `from_uplink` is attached to the node's uplink (a tcx link,
/// as `bpftool net` in the node's namespace lists it).
fn uplink_program_attached(node: &SimNode) -> bool {
    bpftool_ok(
        &mut node
            .netns
            .command(&["bpftool", "net", "show", "dev", "up0"]),
    )
    .contains("tcx/ingress from_uplink")
}

/// UDP between pods on two nodes keeps the answer the fast path keeps for
/// it (`FLOWS`, "clear") on both nodes: the sender's `to_uplink` sees each
/// datagram the fast path redirected out (marked, left alone), not one the
/// host stack sent. Were the mark lost on the way, `to_uplink` would take
/// the answer back after every datagram and none would be left.
#[flatnet_test(root)]
fn udp_between_nodes_keeps_its_kept_answer_past_to_uplink() {
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let (a, b) = (n1.pod(), n2.pod());
    for node in [n1, n2] {
        let net = bpftool_ok(
            &mut node
                .netns
                .command(&["bpftool", "net", "show", "dev", "up0"]),
        );
        assert!(
            net.contains("tcx/egress to_uplink"),
            "{}: {net}",
            node.spec.name
        );
    }
    let receiver = b
        .netns
        .run(|| std::net::UdpSocket::bind((b.ip, 5353)))
        .expect("bind in b");
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let sender = a
        .netns
        .run(|| std::net::UdpSocket::bind((a.ip, 40000)))
        .expect("bind in a");
    let sent_before = n1.packets(action::TO_REMOTE_NODE);
    let mut buffer = [0u8; 64];
    for _ in 0..20 {
        sender.send_to(b"query", (b.ip, 5353)).expect("send");
        receiver
            .recv_from_through_signals(&mut buffer)
            .expect("the datagram arrives");
    }
    assert!(n1.packets(action::TO_REMOTE_NODE) - sent_before >= 20);
    let key = flow_key(
        std::net::SocketAddr::new(a.ip.into(), 40000),
        std::net::SocketAddr::new(b.ip.into(), 5353),
        17,
    );
    for node in [n1, n2] {
        assert_eq!(
            node.datapath().flow_verdict(&key).expect("reading FLOWS"),
            Some(flatnet_common::verdict::CLEAR),
            "{}: the kept answer for a -> b",
            node.spec.name
        );
    }
}

#[flatnet_test(root)]
fn with_ip_masq_pod_traffic_to_other_nodes_pods_keeps_its_source_address() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--ip-masq", "true"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let a = n1.pod();
    let b = n2.pod();
    wait_until("n1's no-masquerade set to hold n2's pods", SETTLE, || {
        no_masq_elements(n1).as_deref() == Some(&["10.244.2.0/24".to_string()][..])
    });
    // Leaving the pod network: masqueraded to the node's address.
    let outside = udp_source(&a.netns, a.ip, &n2.netns, n2.spec.address(), 100);
    assert_eq!(outside, IpAddr::V4(n1.spec.address()), "not masqueraded");
    // To a pod on another node by the host stack (too big for the shrunk
    // uplink, so the fast path hands it over): the pod's own address.
    n1.netns.exec(&["ip", "link", "set", "up0", "mtu", "1400"]);
    let passed = n1.packets(action::REMOTE_PASSED);
    let source = udp_source(&a.netns, a.ip, &b.netns, b.ip, 1472);
    assert!(
        n1.packets(action::REMOTE_PASSED) > passed,
        "not handed to the stack"
    );
    assert_eq!(source, IpAddr::V4(a.ip), "masqueraded on its way to a pod");
    // And by the fast path.
    let source = udp_source(&a.netns, a.ip, &b.netns, b.ip, 100);
    assert_eq!(source, IpAddr::V4(a.ip));
    // n2 leaves the cluster: its CIDR leaves the set.
    let all = specs(&[
        ("n1", 1, Some("10.244.1.0/24")),
        ("n2", 2, Some("10.244.2.0/24")),
    ]);
    cluster.write_peers(&all[..1]);
    wait_until("n2's pods to leave n1's set", SETTLE, || {
        no_masq_elements(n1).is_some_and(|e| e.is_empty())
    });
}

/// A TCP connection another node opens to a pod (a NodePort flow that node
/// sent on with its own address as the source, a host-network client)
/// takes the fast path both ways, past the pod's node's stack, and arrives
/// with the node's address as the stack would deliver it. The pod's own
/// connection to that node still goes through the stack, which masquerades
/// it; UDP from the node (whose replies cannot be told from datagrams the
/// pod sends first) keeps the stack's path too.
#[flatnet_test(root)]
fn a_nodes_tcp_to_a_pod_takes_the_fast_path_and_the_pods_own_stays_masqueraded() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--ip-masq", "true"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let b = n2.pod();
    let n1_address = IpAddr::V4(n1.spec.address());
    wait_until("n2 to know n1's address as a peer node", SETTLE, || {
        n2.datapath()
            .peer_nodes()
            .is_ok_and(|peers| peers.into_iter().collect::<Vec<_>>() == [n1_address])
    });
    let counts = |node: &SimNode| {
        (
            node.packets(action::PEER_NODE_TO_POD),
            node.packets(action::TO_PEER_NODE),
            node.forwarded(),
        )
    };

    // n1 to the pod: both directions in BPF, n1's address kept.
    let before = counts(n2);
    let source = tcp_source(&n1.netns, &b.netns, b.ip.into(), 1 << 20);
    let after = counts(n2);
    assert_eq!(source, n1_address, "the pod saw another source");
    let (into_pod, to_node, by_stack) =
        (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    eprintln!(
        "n2: peer_node_to_pod {into_pod}, to_peer_node {to_node}, stack forwarded {by_stack}"
    );
    assert!(
        into_pod > 20 && to_node > 20,
        "n2's fast path carried {into_pod} packets in and {to_node} out"
    );
    assert!(
        by_stack <= (into_pod + to_node) / 50,
        "n2's stack forwarded {by_stack} packets of the flow"
    );

    // The pod to n1: masqueraded by n2's stack, none of it on the fast path.
    let before = counts(n2);
    let source = tcp_source(&b.netns, &n1.netns, n1_address, 1 << 20);
    let after = counts(n2);
    assert_eq!(source, IpAddr::V4(n2.spec.address()), "not masqueraded");
    assert_eq!(
        (after.0, after.1),
        (before.0, before.1),
        "the pod's own connection took the fast path"
    );
    assert!(after.2 - before.2 > 20, "n2's stack did not carry it");

    // UDP from n1: the stack's.
    let before = counts(n2);
    let source = udp_source(&n1.netns, n1.spec.address(), &b.netns, b.ip, 100);
    assert_eq!(source, n1_address);
    assert_eq!(counts(n2).0, before.0, "n1's UDP took the fast path");
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

#[flatnet_test(root)]
fn uninstall_takes_the_agents_setup_away_and_pods_keep_talking() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--ip-masq", "true"]);
    let n1 = cluster.node("n1");
    let a = n1.pod();
    let a2 = n1.pod();
    wait_until("n1's no-masquerade set to fill", SETTLE, || {
        no_masq_elements(n1).is_some_and(|e| !e.is_empty())
    });
    assert!(uplink_program_attached(n1));
    let managed = flatnet_datapath::node::markers::managed_marker(&n1.network);
    assert!(managed.exists());
    // `--routing auto` (the default) keeps a VXLAN device for peers off
    // this node's subnets.
    assert!(n1.has_link("flatnet.vxlan"));

    // As the uninstall DaemonSet does it: the agent gone first.
    n1.stop_agent();
    assert!(n1.uninstall(), "uninstall failed:\n{}", n1.agent_log());
    assert!(!n1.conflist_path().exists(), "conflist left");
    assert!(!n1.ready_marker().exists(), "ready marker left");
    assert!(!managed.exists(), "managed marker left");
    assert_eq!(n1.routes(), Vec::<String>::new());
    assert_eq!(n1.remote_cidrs(), Vec::<String>::new());
    assert!(!uplink_program_attached(n1), "from_uplink still attached");
    assert!(!n1.has_link("flatnet.vxlan"), "VXLAN device left");
    // The pods' masquerade rules stay while they live; their sets empty.
    assert_eq!(no_masq_elements(n1), Some(Vec::new()));
    // The node's pods keep talking; a second run finds nothing to do.
    tcp_echo(Some(&a2.netns), a2.ip, Some(&a.netns), 1 << 16).expect("pod to pod after uninstall");
    assert!(
        n1.uninstall(),
        "second uninstall failed:\n{}",
        n1.agent_log()
    );
    assert!(n1.datapath().exists(), "the datapath went with pods on it");

    // The last pod's DEL takes the datapath, rules and sets away.
    drop(a);
    drop(a2);
    assert!(!n1.datapath().exists(), "pins left after the last DEL");
    let lock_file = PathBuf::from(format!("/run/flatnet/network-{}.lock", n1.network));
    assert!(!lock_file.exists(), "{} left", lock_file.display());
    assert_eq!(no_masq_elements(n1), None, "no-masquerade set left");
    let tables = n1.netns.exec(&["nft", "list", "tables"]);
    assert!(!tables.contains("flatnet"), "{tables}");

    // A conflist the agent did not write is left alone.
    std::fs::create_dir_all(n1.conflist_path().parent().unwrap()).unwrap();
    let by_hand = json!({"cniVersion": "1.0.0", "name": n1.network,
        "plugins": [{"type": "flatnet", "ipam": {"type": "flatnet-ipam", "subnet": "10.244.1.0/24"}}]});
    std::fs::write(n1.conflist_path(), by_hand.to_string()).unwrap();
    assert!(
        n1.uninstall(),
        "third uninstall failed:\n{}",
        n1.agent_log()
    );
    assert!(
        n1.conflist_path().exists(),
        "a hand-written conflist was removed"
    );
}

#[flatnet_test(root)]
fn dual_stack_pods_on_two_nodes_talk_over_ipv6_through_the_fast_path() {
    let cluster = Cluster::started(&Cluster::numbered(2, true), &[]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let list = n1.conflist();
    assert_eq!(
        list["plugins"][0]["ipam"]["ranges"][1][0]["subnet"],
        "fd44:0:0:1::/64"
    );
    let routes6 = n1
        .netns
        .exec(&["ip", "-6", "route", "show", "proto", ROUTE_PROTO]);
    assert!(routes6.contains("fd44:0:0:2::/64 via fd30::2"), "{routes6}");
    assert!(
        n1.remote_cidrs()
            .contains(&"fd44:0:0:2::/64 via fd30::2".to_string()),
        "{:?}",
        n1.remote_cidrs()
    );
    let a = n1.pod();
    let b = n2.pod();
    let (a6, b6) = (
        a.ip6.expect("an IPv6 address"),
        b.ip6.expect("an IPv6 address"),
    );
    assert!(a6.to_string().starts_with("fd44:0:0:1::"), "{a6}");
    let before = (
        n1.bytes(action::TO_REMOTE_NODE),
        n2.bytes(action::FROM_UPLINK),
        n2.bytes(action::TO_REMOTE_NODE),
        n1.bytes(action::FROM_UPLINK),
    );
    tcp_echo(Some(&b.netns), b6, Some(&a.netns), 1 << 20).expect("n1 -> n2 over IPv6");
    tcp_echo(Some(&a.netns), a6, Some(&b.netns), 1 << 20).expect("n2 -> n1 over IPv6");
    let sent1 = n1.bytes(action::TO_REMOTE_NODE) - before.0;
    let received2 = n2.bytes(action::FROM_UPLINK) - before.1;
    let sent2 = n2.bytes(action::TO_REMOTE_NODE) - before.2;
    let received1 = n1.bytes(action::FROM_UPLINK) - before.3;
    eprintln!(
        "IPv6: n1 sent {sent1}, n2 delivered {received2}; n2 sent {sent2}, n1 delivered {received1}"
    );
    for (what, count) in [
        ("n1 fast path out", sent1),
        ("n2 uplink to pod", received2),
        ("n2 fast path out", sent2),
        ("n1 uplink to pod", received1),
    ] {
        // 2 MiB of payload each way (1 MiB sent, 1 MiB echoed), headers on
        // top; 2% may have taken the stack.
        assert!(count > (2 << 20) * 49 / 50, "{what}: {count} bytes");
    }
    // IPv4 still works beside it.
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1000).expect("n1 -> n2 over IPv4");
}

#[flatnet_test(root)]
fn xdp_mode_pods_on_two_nodes_talk_through_the_stack_both_ways() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--datapath", "xdp"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    assert_eq!(n1.conflist()["plugins"][0]["datapath"], "xdp");
    assert!(
        uplink_program_attached(n1),
        "from_uplink not on n1's uplink"
    );
    let a = n1.pod();
    let b = n2.pod();
    let (passed, forwarded, forwarded2) = (
        n1.bytes(action::REMOTE_PASSED),
        n1.forwarded(),
        n2.forwarded(),
    );
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), 1 << 20).expect("n2 -> n1");
    // XDP has no redirect-to-neighbour: the sender's stack routes them...
    assert!(n1.bytes(action::REMOTE_PASSED) - passed > (2 << 20) * 49 / 50);
    // (The node's stack counts segments: GSO packets are cut for the uplink.)
    assert!(n1.forwarded() - forwarded > 50);
    assert_eq!(n1.packets(action::TO_REMOTE_NODE), 0);
    // ...and so does the receiver's, so that each node's conntrack sees
    // both directions of every flow: the uplink program hands nothing to
    // pods in XDP mode.
    assert!(n2.forwarded() - forwarded2 > 50);
    assert_eq!(n2.packets(action::FROM_UPLINK), 0);
    assert_eq!(n1.packets(action::FROM_UPLINK), 0);
}

#[flatnet_test(root)]
fn an_explicit_uplink_and_mtu_reach_the_conflist_the_pods_and_the_traffic() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--uplink", "up0", "--mtu", "1400"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    assert_eq!(n1.conflist()["plugins"][0]["mtu"], 1400);
    assert!(uplink_program_attached(n1));
    let a = n1.pod();
    let b = n2.pod();
    let mtu = a.netns.exec(&["cat", "/sys/class/net/eth0/mtu"]);
    assert_eq!(mtu.trim(), "1400");
    let (sent, passed) = (
        n1.bytes(action::TO_REMOTE_NODE),
        n1.bytes(action::REMOTE_PASSED),
    );
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2");
    let sent = n1.bytes(action::TO_REMOTE_NODE) - sent;
    let passed = n1.bytes(action::REMOTE_PASSED) - passed;
    assert!(
        sent > 1 << 20 && passed < sent / 50,
        "fast path {sent} B, passed to the stack {passed} B"
    );
}

/// Kernel ids of the node's pinned `from_pod` and `from_uplink`: a reload
/// makes new programs, with new ids, under the same pin names.
fn program_ids(node: &SimNode) -> Vec<u32> {
    let datapath = node.datapath();
    [PROG_FROM_POD, PROG_FROM_UPLINK]
        .into_iter()
        .map(|name| {
            datapath
                .program(name)
                .and_then(|p| p.id())
                .unwrap_or_else(|e| panic!("{name} of {}: {e}", node.spec.name))
        })
        .collect()
}

#[flatnet_test(root)]
fn restarting_agents_keeps_an_established_tcp_stream() {
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let a = n1.pod();
    let b = n2.pod();
    let routes_before = (n1.routes(), n2.routes());
    let programs_before = program_ids(n1);
    let fast_before = n1.packets(action::TO_REMOTE_NODE);
    let mut fast_while_down = 0;
    let (sent, received) = stream_during(&b.netns, b.ip, &a.netns, || {
        for node in [n1, n2] {
            node.stop_agent();
            // Agent gone: STATUS says the node cannot take pods (50)...
            let status = node.cni("STATUS", None);
            status.assert_error(50, "agent");
            // ...while the pinned datapath keeps carrying the stream.
            let counted = node.packets(action::TO_REMOTE_NODE);
            // A window of the stream: the counter must grow within it.
            std::thread::sleep(Duration::from_millis(300));
            fast_while_down += node.packets(action::TO_REMOTE_NODE) - counted;
            node.start_agent(&cluster.file());
            node.wait_ready();
        }
    });
    assert_eq!(sent, received, "bytes were lost across agent restarts");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");
    assert!(fast_while_down > 0, "the fast path stopped with the agent");
    assert!(n1.packets(action::TO_REMOTE_NODE) > fast_before);
    assert_eq!((n1.routes(), n2.routes()), routes_before);
    for node in [n1, n2] {
        assert!(node.cni("STATUS", None).success());
    }
    // And the datapath was not reloaded: the very programs of before.
    assert_eq!(program_ids(n1), programs_before);
}

/// One datapath build per node, the agent's. An agent of another build
/// (its programs pinned under their own build id) meets a plugin of this
/// build: the plugin's ADD refuses to pin its programs over the agent's,
/// saying which builds meet, and leaves nothing behind. The rolling
/// upgrade (an agent of the plugin's build starting) loads its own build,
/// moves the running pods onto it and retires the other; ADD works again.
#[flatnet_test(root)]
fn a_plugin_of_another_build_never_replaces_the_agents_datapath() {
    const OTHER_BUILD: &str = "0123456789ab";
    let cluster = Cluster::with_file_agents(1);
    let n1 = cluster.node("n1");
    let a = n1.pod();
    // The agent of "another build": its programs pinned under that id.
    n1.stop_agent();
    let pins = n1.datapath().pin_dir().to_path_buf();
    let own = format!("-{}", flatnet_datapath::bpf::DATAPATH_ID);
    for entry in std::fs::read_dir(&pins).expect("pins").flatten() {
        let name = entry.file_name().into_string().expect("a pin name");
        if let Some(program) = name.strip_suffix(&own) {
            std::fs::rename(entry.path(), pins.join(format!("{program}-{OTHER_BUILD}")))
                .expect("re-pin under the other build's id");
        }
    }
    let links_before = run_ok(Command::new("ip").args(["-n", &n1.netns.name, "-o", "link"]));
    let netns = Netns::new();
    let out = n1.cni("ADD", Some(("ctr-other-build", &netns.path())));
    out.assert_error(101, OTHER_BUILD);
    out.assert_error(101, flatnet_datapath::bpf::DATAPATH_ID);
    // Nothing of the failed ADD is left, and the other build stays pinned.
    let links_after = run_ok(Command::new("ip").args(["-n", &n1.netns.name, "-o", "link"]));
    assert_eq!(
        links_after.lines().count(),
        links_before.lines().count(),
        "{links_after}"
    );
    assert_eq!(
        n1.datapath().other_pinned_build().as_deref(),
        Some(OTHER_BUILD)
    );
    // The rolling upgrade: the agent of this build starts.
    n1.start_agent(&cluster.file());
    n1.wait_ready();
    assert_eq!(n1.datapath().other_pinned_build(), None);
    assert!(
        !std::fs::read_dir(&pins)
            .expect("pins")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(OTHER_BUILD)),
        "the other build's programs were not retired"
    );
    let b = n1.pod_in(netns, "");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), 100_000).expect("b -> a after the upgrade");
}

// ---------------------------------------------------------------------------
// The agent against a stub of the Kubernetes API server (kube_stub.rs).

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
    let listener = node
        .netns
        .run(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .unwrap();
    let served = ServedStub::start(listener);
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

#[flatnet_test(root)]
fn a_moved_pin_root_travels_in_the_conflist_and_cannot_split_the_datapath() {
    // The agents pin under the test's own bpffs, not /sys/fs/bpf/flatnet;
    // the plugin runs with the CNI variables only, as a runtime runs it.
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    assert_eq!(
        n1.conflist()["plugins"][0]["pinRoot"],
        n1.pin_root.display().to_string()
    );
    let a = n1.pod();
    let b = n2.pod();
    // The pods' entries are in the maps the agents' uplink programs read.
    for (node, pod) in [(n1, &a), (n2, &b)] {
        let endpoint = node.datapath().endpoint(pod.ip.into()).expect("endpoint");
        assert!(
            endpoint.is_some(),
            "{} is not in {}'s maps",
            pod.ip,
            node.spec.name
        );
    }
    let (out, delivered) = (
        n1.bytes(action::TO_REMOTE_NODE),
        n2.bytes(action::FROM_UPLINK),
    );
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2");
    // 1 MiB out to b and 1 MiB of echo back in (headers on top).
    assert!(n1.bytes(action::TO_REMOTE_NODE) - out > (1 << 20) * 49 / 50);
    assert!(n2.bytes(action::FROM_UPLINK) - delivered > (1 << 20) * 49 / 50);
    // A plugin told to pin elsewhere is refused, and makes nothing.
    let netns = Netns::new();
    let elsewhere = std::path::Path::new("/sys/fs/bpf/flatnet-elsewhere");
    let out = n1.cni_with_env(
        "ADD",
        Some(("split", &netns.path())),
        &[("FLATNET_PIN_ROOT", elsewhere)],
    );
    out.assert_error(7, "disagrees with the configuration's \"pinRoot\"");
    assert!(!elsewhere.exists(), "the refused ADD pinned something");
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
    let cluster = Cluster::new(&specs(&[("cp-1", 1, Some("10.244.0.0/24"))]));
    let node = cluster.node("cp-1");
    let listener = node
        .netns
        .run(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .unwrap();
    let served = ServedStub::start(listener);
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
    let written = |slot: u32| {
        let flags = datapath.pod_policy(slot).unwrap().flags;
        let rules: Vec<String> = datapath
            .pod_policy_rules(slot)
            .unwrap()
            .iter()
            .map(|(direction, rule)| format!("{direction} {} {:?}", rule.cidr, rule.ports))
            .collect();
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
    node.stop_agent();
    drop((web, client));
    drop(served);
}

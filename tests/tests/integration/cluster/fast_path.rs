//! Pods on different nodes talk through the BPF fast path (TCP and UDP,
//! the node's own TCP to a pod too), what it cannot route falls back to
//! the host stack, and pod sources are kept with ipMasq.

use flatnet_harness::RecvThroughSignals;
use std::net::IpAddr;
use std::time::Duration;

use flatnet_common::action;
use flatnet_datapath::bpf::flow_key;
use flatnet_tests::cluster::*;
use flatnet_tests::*;

use super::fixture::no_masq_elements;

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

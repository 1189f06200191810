//! Outside clients reach NodePorts over IPv6: both backends over TCP and
//! UDP, fragmented datagrams and packet too big translated, ICMPv6 port
//! unreachables back to the client, and a hostPort.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use flatnet_datapath::bpf::service_key;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::path_report::{ipv6_path_report, udp_exchange};
use flatnet_tests::*;

use crate::socket_lb::api::{BACKEND_PORT, ebpf_services_cluster_of};

use super::exchanges::{
    Echo, LARGE_DATAGRAM, LateUdp, large_datagram_echoed, learn_path_mtu, tcp_answers, tcp_ask,
    udp_ask, udp_refused,
};
use super::fixture::{
    LATE_BACKEND_PORT, LATE_NODE_PORT, NODE_PORT, add_outside6, assert_served_in_bpf,
    dual_stack_node_port_service, dual_stack_nodes, ipv6_node_port_slice,
};

/// The same over IPv6, kube-proxy absent: dual-stack nodes (their Node
/// objects given an IPv6 InternalIP and pod CIDR), a dual-stack NodePort
/// Service, an outside client at fd30::64. Through either node's IPv6
/// address both backends answer, TCP and UDP: the other node's backend
/// seeing that node's IPv6 address, the node's own the pod network's
/// gateway address (what MASQUERADE selects toward it over IPv6); the
/// uplink counts both ways on cp-1. Once the backends stop
/// listening, UDP is refused (their ICMPv6 errors translated back).
#[flatnet_test(root)]
fn clients_outside_reach_node_ports_over_ipv6() {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let specs = dual_stack_nodes(&stub);
    let (cluster, _served) = ebpf_services_cluster_of(&specs, &cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let outside = &cluster._switch;
    add_outside6(outside);
    let (local, remote) = (cp.pod(), worker.pod());
    let (local6, remote6) = (
        local.ip6.expect("a dual-stack pod"),
        remote.ip6.expect("a dual-stack pod"),
    );
    let _servers = [
        Echo::start(&local.netns, "local"),
        Echo::start(&remote.netns, "remote"),
    ];
    let backends6 = [(local6, "cp-1"), (remote6, "worker-1")];
    // Where a datagram goes, for a failure to say where it died.
    let path = [
        ("client", outside),
        ("cp-1", &cp.netns),
        ("worker-1", &worker.netns),
        ("local pod", &local.netns),
        ("remote pod", &remote.netns),
    ];
    stub.add(
        Kind::Service,
        dual_stack_node_port_service("np6", 31, NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        ipv6_node_port_slice("np6", &backends6, BACKEND_PORT),
    );
    // Both agents serve an IPv6 NodePort's `protocols` with both backends.
    let serve_ipv6 = |what: &str, port: u16, protocols: &[u8]| {
        let wildcard = std::net::Ipv6Addr::UNSPECIFIED.into();
        wait_until(what, SETTLE, || {
            [cp, worker].iter().all(|node| {
                protocols.iter().all(|protocol| {
                    node.datapath()
                        .service_backends(&service_key(wildcard, port, *protocol))
                        .unwrap()
                        .is_some_and(|set| set.len() == 2)
                })
            })
        });
    };
    serve_ipv6(
        "both agents to serve the IPv6 NodePort",
        NODE_PORT,
        &[6, 17],
    );
    for node in [cp, worker] {
        let to = SocketAddr::from((node.spec.address6(), NODE_PORT));
        let seen_from = node.spec.address6();
        // The backend on the node itself sees the pod network's gateway
        // address, the source MASQUERADE selects toward it over IPv6.
        let (local_seen_from, remote_seen_from) = if node.spec.name == "cp-1" {
            (
                format!("fd44:0:0:{:x}::1", cp.spec.index),
                seen_from.to_string(),
            )
        } else {
            (
                seen_from.to_string(),
                format!("fd44:0:0:{:x}::1", worker.spec.index),
            )
        };
        let both = BTreeSet::from([
            format!("local {local_seen_from}"),
            format!("remote {remote_seen_from}"),
        ]);
        assert_eq!(
            tcp_answers(outside, to, 16),
            both,
            "TCP from outside to {to}"
        );
        let answers: BTreeSet<String> = (0..16)
            .map(|try_| {
                let (answer, from) = udp_exchange(outside, to).unwrap_or_else(|lost| {
                    panic!(
                        "UDP to {to} (try {try_}, client port {}): {}; answer late: {:?}\n{}",
                        lost.client_port,
                        lost.error,
                        lost.late,
                        ipv6_path_report(&path, &[cp, worker])
                    )
                });
                assert_eq!(from, to, "a UDP answer's source");
                answer
            })
            .collect();
        assert_eq!(answers, both, "UDP from outside to {to}");
    }
    assert_served_in_bpf(cp, "IPv6");
    // Datagrams too large for one packet, over IPv6: the client's kernel
    // sends fragments (a fragment header each), and so does the backend's
    // with its echo; every fragment translated (the later ones by their
    // first one's ports, `NAT_FRAGMENTS6`), echoed whole from the NodePort.
    // The pods' MTU is the uplink's less VXLAN's overhead (`--routing
    // auto`), and IPv6 routers do not fragment: the other node's stack
    // answers the first fragments for its pod with packet too big, which
    // reaches the client translated back (a quoted fragment header), as
    // kube-proxy's conntrack would relate it; the client's kernel then
    // sends smaller fragments to that NodePort.
    let _large = [LateUdp::start(&local.netns), LateUdp::start(&remote.netns)];
    stub.add(
        Kind::Service,
        dual_stack_node_port_service("large6", 32, LATE_NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        ipv6_node_port_slice("large6", &backends6, LATE_BACKEND_PORT),
    );
    serve_ipv6(
        "both agents to serve the large datagrams' NodePort",
        LATE_NODE_PORT,
        &[17],
    );
    for node in [cp, worker] {
        let to = SocketAddr::from((node.spec.address6(), LATE_NODE_PORT));
        let learned = learn_path_mtu(outside, to);
        assert!(
            learned.is_some_and(|mtu| mtu < 1500),
            "no packet too big for {to} reached the client: {learned:?}"
        );
        // Four tries: both backends are asked.
        assert!(
            (0..4).all(|_| large_datagram_echoed(outside, to)),
            "a {LARGE_DATAGRAM}-byte datagram to {to} was not echoed whole from it"
        );
    }
    // Backends that stop listening refuse over IPv6 too: their ICMPv6 port
    // unreachable reaches the client translated back (the quoted datagram
    // the client's again, the error from the NodePort). Their rate limit
    // off: a kernel sends a peer only a few errors at once.
    for pod in [&local, &remote] {
        pod.netns
            .exec(&["sysctl", "-qw", "net.ipv6.icmp.ratelimit=0"]);
    }
    drop(_servers);
    for node in [cp, worker] {
        let to = SocketAddr::from((node.spec.address6(), NODE_PORT));
        if let Some(try_) = (0..8).find(|_| !udp_refused(outside, to)) {
            panic!(
                "UDP to {to}, its backends listening on nothing, was not refused (try {try_})\n{}",
                ipv6_path_report(&path, &[cp, worker])
            );
        }
    }
    // A hostPort over IPv6 too (flatnet's, `--host-ports auto`): the pod's
    // IPv6 address behind every IPv6 node address, the client's kept.
    let host_port = NODE_PORT + 10;
    let web = cp.pod_with_host_ports(serde_json::json!([
        {"hostPort": host_port, "containerPort": BACKEND_PORT, "protocol": "tcp"},
        {"hostPort": host_port, "containerPort": BACKEND_PORT, "protocol": "udp"},
    ]));
    let _web_server = Echo::start(&web.netns, "web");
    let to = SocketAddr::from((cp.spec.address6(), host_port));
    assert_eq!(
        tcp_ask(outside, to).expect("TCP to an IPv6 hostPort"),
        "web fd30::64"
    );
    assert_eq!(
        udp_ask(outside, to).expect("UDP to an IPv6 hostPort"),
        ("web fd30::64".to_string(), to)
    );
    drop(web);
    for node in &cluster.nodes {
        node.stop_agent();
        node.datapath().detach_services().unwrap();
    }
}

//! The fast path invisible: an outside client gets the same from flatnet's
//! NodePorts as from kube-proxy's rules, over IPv4 in tc and XDP mode and
//! over IPv6.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};

use flatnet_common::action;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;

use crate::socket_lb::api::{BACKEND_PORT, ebpf_services_cluster_of};

use super::fixture::{
    CLOSED_BACKEND_PORT, CLOSED_NODE_PORT, LATE_BACKEND_PORT, LATE_NODE_PORT, NODE_PORT, OUTSIDE,
    add_outside6, assert_served_in_bpf, dual_stack_node_port_service, dual_stack_nodes,
    ipv6_node_port_slice, node_port_service, node_port_slice, two_nodes_and_outside_flagged,
};
use super::outcome::{Family, compare_outcomes, serve_side_by_side, wait_for_node_ports};

/// The fast path invisible: the same outside client through a cluster
/// whose NodePorts are flatnet's (`--services ebpf`, kube-proxy absent)
/// and through one where kube-proxy's iptables rules (the fixture) serve
/// them on flatnet's fast path gets the same: each node reaches both
/// backends over TCP and UDP, both backends see the node's address (the
/// local one too: MASQUERADE picks it, the host veth having none), UDP
/// answers come from the NodePort, another port is refused, and a Service
/// whose backends listen on nothing refuses TCP (the backend's reset) and
/// UDP (its port unreachable, which conntrack relates to the flow and
/// flatnet translates back in BPF); and a backend whose answer comes after
/// the client's socket closed gets the client's port unreachable (the other
/// way through the same translation); and datagrams fragmented both ways
/// are echoed whole (later fragments translated by their first one's ports).
/// Both clusters in each datapath mode: in XDP mode the pods' host veths
/// run `from_pod_xdp`, and a local backend's replies and errors, passed to
/// the stack, are translated at tc ingress of the same veth
/// (`from_pod_passed`).
#[flatnet_test(root, cases(tc("tc"), xdp("xdp")))]
fn node_ports_from_outside_answer_as_kube_proxys_rules_do(datapath: &str) {
    use flatnet_tests::kube_proxy::{Mode, Protocol, ServicePort};

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let mode_flags = ["--datapath", datapath];
    let (flatnet, _served) = two_nodes_and_outside_flagged(&cgroup, &stub, &mode_flags);
    let kube_proxy = Cluster::started(
        &specs(&[
            ("cp-1", 1, Some("10.244.0.0/24")),
            ("worker-1", 2, Some("10.244.1.0/24")),
        ]),
        &mode_flags,
    );
    for cluster in [&flatnet, &kube_proxy] {
        let conflist = cluster.node("cp-1").conflist();
        assert_eq!(conflist["plugins"][0]["datapath"], datapath);
    }
    kube_proxy
        ._switch
        .exec(&["ip", "addr", "add", &format!("{OUTSIDE}/24"), "dev", "br0"]);
    let pods: Vec<_> = [&flatnet, &kube_proxy]
        .iter()
        .map(|c| (c.node("cp-1").pod(), c.node("worker-1").pod()))
        .collect();
    let _servers = serve_side_by_side([&flatnet, &kube_proxy], &pods, Family::V4);

    // flatnet: the Service and its slice from the API.
    let (local, remote) = &pods[0];
    stub.add(
        Kind::Service,
        node_port_service("np", Ipv4Addr::new(10, 96, 9, 50), NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        node_port_slice("np", &[(local.ip, "cp-1"), (remote.ip, "worker-1")]),
    );
    stub.add(
        Kind::Service,
        node_port_service("closed", Ipv4Addr::new(10, 96, 9, 51), CLOSED_NODE_PORT),
    );
    let mut closed = node_port_slice("closed", &[(local.ip, "cp-1"), (remote.ip, "worker-1")]);
    for port in closed["ports"].as_array_mut().expect("ports") {
        port["port"] = CLOSED_BACKEND_PORT.into();
    }
    stub.add(Kind::EndpointSlice, closed);
    stub.add(
        Kind::Service,
        node_port_service("late", Ipv4Addr::new(10, 96, 9, 52), LATE_NODE_PORT),
    );
    let mut late = node_port_slice("late", &[(local.ip, "cp-1"), (remote.ip, "worker-1")]);
    for port in late["ports"].as_array_mut().expect("ports") {
        port["port"] = LATE_BACKEND_PORT.into();
    }
    stub.add(Kind::EndpointSlice, late);
    // kube-proxy: the same Services as its iptables rules hold them.
    let (local, remote) = &pods[1];
    let endpoints = |port: u16| {
        vec![
            SocketAddr::from((local.ip, port)),
            SocketAddr::from((remote.ip, port)),
        ]
    };
    let cluster_ip = std::net::IpAddr::V4(Ipv4Addr::new(10, 96, 9, 50));
    let closed_ip = std::net::IpAddr::V4(Ipv4Addr::new(10, 96, 9, 51));
    kube_proxy.program_kube_proxy(
        Mode::Iptables,
        &[
            ServicePort::cluster_ip("np", cluster_ip, 80, Protocol::Tcp, endpoints(BACKEND_PORT))
                .with_node_port(NODE_PORT),
            ServicePort::cluster_ip("np", cluster_ip, 53, Protocol::Udp, endpoints(BACKEND_PORT))
                .with_node_port(NODE_PORT),
            ServicePort::cluster_ip(
                "closed",
                closed_ip,
                80,
                Protocol::Tcp,
                endpoints(CLOSED_BACKEND_PORT),
            )
            .with_node_port(CLOSED_NODE_PORT),
            ServicePort::cluster_ip(
                "closed",
                closed_ip,
                53,
                Protocol::Udp,
                endpoints(CLOSED_BACKEND_PORT),
            )
            .with_node_port(CLOSED_NODE_PORT),
            ServicePort::cluster_ip(
                "late",
                std::net::IpAddr::V4(Ipv4Addr::new(10, 96, 9, 52)),
                53,
                Protocol::Udp,
                endpoints(LATE_BACKEND_PORT),
            )
            .with_node_port(LATE_NODE_PORT),
        ],
    );
    wait_for_node_ports(
        &flatnet,
        Ipv4Addr::UNSPECIFIED.into(),
        &[
            (NODE_PORT, 6),
            (NODE_PORT, 17),
            (CLOSED_NODE_PORT, 6),
            (CLOSED_NODE_PORT, 17),
            (LATE_NODE_PORT, 17),
        ],
    );
    let backends = |c: usize| [&pods[c].0.netns, &pods[c].1.netns];
    let same = compare_outcomes(
        [&flatnet, &kube_proxy],
        [backends(0), backends(1)],
        Family::V4,
    );
    assert_eq!(
        same.answers[&("cp-1".to_string(), "tcp")],
        BTreeSet::from(["on-cp-1 node".to_string(), "on-worker-1 node".to_string()])
    );
    // flatnet's side was served in BPF, both ways, whatever the mode.
    assert_served_in_bpf(flatnet.node("cp-1"), datapath);
    // And the backend's node carried cp-1's TCP flows past its stack in tc
    // mode; XDP mode's stack takes what comes from other nodes.
    let worker = flatnet.node("worker-1");
    let carried = [action::PEER_NODE_TO_POD, action::TO_PEER_NODE].map(|what| worker.packets(what));
    if datapath == "tc" {
        assert!(
            carried.iter().all(|&n| n > 0),
            "worker-1 carried {carried:?}"
        );
    } else {
        assert_eq!(carried, [0, 0], "worker-1 carried cp-1's flows in XDP mode");
    }
}

/// The fast path invisible over IPv6: the IPv4 comparison above, made
/// over the nodes' IPv6 addresses to dual-stack NodePorts (tc mode):
/// flatnet's NodePort path against kube-proxy's ip6tables rules, both
/// clusters dual-stack. Besides answers, sources, refusals and late
/// answers' port unreachables (ICMPv6 both ways), the path MTU: the pods'
/// MTU is the uplink's less VXLAN's overhead, IPv6 routers do not
/// fragment, so a large datagram to a backend meets a packet too big that
/// only reaches the client translated back (conntrack relates it; flatnet
/// translates the quoted fragment header's datagram); then datagrams
/// fragmented both ways are echoed whole.
#[flatnet_test(root)]
fn node_ports_from_outside_over_ipv6_answer_as_kube_proxys_rules_do() {
    use flatnet_tests::kube_proxy::{Mode, Protocol, ServicePort};

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let specs = dual_stack_nodes(&stub);
    let (flatnet, _served) = ebpf_services_cluster_of(&specs, &cgroup, &stub);
    let kube_proxy = Cluster::started(&specs, &[]);
    let pods: Vec<_> = [&flatnet, &kube_proxy]
        .iter()
        .map(|c| (c.node("cp-1").pod(), c.node("worker-1").pod()))
        .collect();
    for cluster in [&flatnet, &kube_proxy] {
        add_outside6(&cluster._switch);
    }
    let _servers = serve_side_by_side([&flatnet, &kube_proxy], &pods, Family::V6);
    let ipv6 = |pod: &SimPod| pod.ip6.expect("a dual-stack pod");

    // flatnet: three dual-stack Services, their IPv6 slices from the API.
    let (local, remote) = &pods[0];
    let backends6 = [(ipv6(local), "cp-1"), (ipv6(remote), "worker-1")];
    for (name, n, node_port, backend_port) in [
        ("np", 50, NODE_PORT, BACKEND_PORT),
        ("closed", 51, CLOSED_NODE_PORT, CLOSED_BACKEND_PORT),
        ("late", 52, LATE_NODE_PORT, LATE_BACKEND_PORT),
    ] {
        stub.add(
            Kind::Service,
            dual_stack_node_port_service(name, n, node_port),
        );
        stub.add(
            Kind::EndpointSlice,
            ipv6_node_port_slice(name, &backends6, backend_port),
        );
    }
    // kube-proxy: the same Services' IPv6 ports as its rules hold them.
    let (local, remote) = &pods[1];
    let endpoints = |port: u16| {
        vec![
            SocketAddr::from((ipv6(local), port)),
            SocketAddr::from((ipv6(remote), port)),
        ]
    };
    let cluster_ip =
        |n: u16| std::net::IpAddr::V6(std::net::Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, 9, n));
    let mut ports = Vec::new();
    for (name, n, node_port, backend_port) in [
        ("np", 0x50, NODE_PORT, BACKEND_PORT),
        ("closed", 0x51, CLOSED_NODE_PORT, CLOSED_BACKEND_PORT),
        ("late", 0x52, LATE_NODE_PORT, LATE_BACKEND_PORT),
    ] {
        for (port, protocol) in [(80, Protocol::Tcp), (53, Protocol::Udp)] {
            ports.push(
                ServicePort::cluster_ip(
                    name,
                    cluster_ip(n),
                    port,
                    protocol,
                    endpoints(backend_port),
                )
                .with_node_port(node_port),
            );
        }
    }
    kube_proxy.program_kube_proxy(Mode::Iptables, &ports);
    let ports: Vec<(u16, u8)> = [NODE_PORT, CLOSED_NODE_PORT, LATE_NODE_PORT]
        .into_iter()
        .flat_map(|port| [(port, 6), (port, 17)])
        .collect();
    wait_for_node_ports(&flatnet, std::net::Ipv6Addr::UNSPECIFIED.into(), &ports);
    let backends = |c: usize| [&pods[c].0.netns, &pods[c].1.netns];
    let same = compare_outcomes(
        [&flatnet, &kube_proxy],
        [backends(0), backends(1)],
        Family::V6,
    );
    assert!(
        same.learned_path_mtu
            .values()
            .all(|mtu| mtu.is_some_and(|mtu| mtu < 1500)),
        "{same:?}"
    );
    assert_served_in_bpf(flatnet.node("cp-1"), "IPv6");
    for node in &flatnet.nodes {
        node.stop_agent();
        node.datapath().detach_services().unwrap();
    }
}

//! ClusterIPs through kube-proxy's rules with the fast path beside them: same
//! node, ICMP errors, backends on both nodes, hairpin.

use super::*;
use flatnet_harness::RecvThroughSignals;

#[flatnet_test(root, cases(iptables(Mode::Iptables, &[]), nftables(Mode::Nftables, &[]), xdp_iptables(Mode::Iptables, &["--datapath", "xdp"]), xdp_nftables(Mode::Nftables, &["--datapath", "xdp"])))]
fn clusterip_to_a_backend_on_the_same_node(mode: Mode, flags: &[&str]) {
    let services = ServiceCluster::flagged(mode, 2, flags);
    let n1 = services.node("n1");
    let (client, backend) = (n1.pod(), n1.pod());
    let _tcp = TcpBackend::start(&backend, "b", BACKEND_PORT);
    let _udp = UdpBackend::start(&backend, "b", DNS_PORT);
    let list: Vec<ServicePort> = FAMILIES
        .into_iter()
        .flat_map(|family| [web(family, &[&backend]), dns(family, &[&backend])])
        .collect();
    services.program(&list);
    for family in FAMILIES {
        let before = translated(n1);
        let name = tcp_request(
            &client,
            SocketAddr::new(cluster_ip(family, 10), 80),
            64 << 10,
        )
        .unwrap_or_else(|e| panic!("{mode:?} {family:?} TCP to a ClusterIP: {e}"));
        assert_eq!(name, "b");
        let name = udp_query(
            &client,
            SocketAddr::new(cluster_ip(family, 53), DNS_PORT),
            "q1",
        )
        .unwrap_or_else(|e| panic!("{mode:?} {family:?} UDP to a ClusterIP: {e}"));
        assert_eq!(name, "b");
        assert!(
            translated(n1) > before,
            "{family:?}: no reply was handed to the stack as translated"
        );
    }
}

/// True when a datagram from `client` to `to` (on a connected socket) is
/// answered by an ICMP port unreachable the socket accepts as its own:
/// `recv` fails with "connection refused". Ten tries over five seconds:
/// the kernel rate-limits ICMP errors, and on a loaded machine the first
/// datagrams may wait for neighbour resolution across the nodes.
fn udp_refused(client: &SimPod, to: SocketAddr) -> bool {
    client.netns.run(|| {
        let bind: SocketAddr = if to.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind).expect("bind");
        socket.connect(to).expect("connect");
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 64];
        for _ in 0..10 {
            let _ = socket.send(b"anyone?");
            if let Err(e) = socket.recv_through_signals(&mut buf)
                && e.kind() == std::io::ErrorKind::ConnectionRefused
            {
                return true;
            }
        }
        false
    })
}

/// ICMP errors of a translated flow (a UDP Service whose backend has no
/// socket on the port, on the client's node and on the other node) reach
/// the client as errors about the ClusterIP it talked to; errors of a
/// direct flow keep working too.
#[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
fn icmp_errors_reach_the_client(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let client = n1.pod();
    let (near, far) = (n1.pod(), n2.pod());
    let mut list = Vec::new();
    for family in FAMILIES {
        for (n, backend) in [(20, &near), (21, &far)] {
            list.push(ServicePort::cluster_ip(
                &format!("closed{n}-{family:?}").to_lowercase(),
                cluster_ip(family, n),
                9999,
                Protocol::Udp,
                vec![SocketAddr::new(pod_ip(backend, family), 9999)],
            ));
        }
    }
    services.program(&list);
    for family in FAMILIES {
        for (n, what) in [(20, "on the same node"), (21, "on another node")] {
            assert!(
                udp_refused(&client, SocketAddr::new(cluster_ip(family, n), 9999)),
                "{mode:?} {family:?}: no port unreachable through a ClusterIP whose backend is {what}"
            );
        }
        assert!(
            udp_refused(&client, SocketAddr::new(pod_ip(&near, family), 9999)),
            "{mode:?} {family:?}: no port unreachable from a pod directly"
        );
    }
}

/// Three backends, two on the client's node and one on the other: every
/// connection completes, whichever backend kube-proxy picks, and each
/// backend gets some (replies from the remote one come back through the
/// client node's uplink program, which must hand them to the stack). The
/// same with the nodes tunnelled (`--routing vxlan`): the remote backend's
/// replies are encapsulated by the fast path, and n1's `from_tunnel` hands
/// them to the stack, which undoes the translation.
#[flatnet_test(root, cases(iptables(Mode::Iptables, &[]), nftables(Mode::Nftables, &[]), vxlan_iptables(Mode::Iptables, &["--routing", "vxlan"]), vxlan_nftables(Mode::Nftables, &["--routing", "vxlan"])))]
fn clusterip_spreads_over_local_and_remote_backends(mode: Mode, flags: &[&str]) {
    let services = ServiceCluster::flagged(mode, 2, flags);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let client = n1.pod();
    let backends = [n1.pod(), n1.pod(), n2.pod()];
    let names = ["local1", "local2", "remote"];
    let _servers: Vec<TcpBackend> = backends
        .iter()
        .zip(names)
        .map(|(pod, name)| TcpBackend::start(pod, name, BACKEND_PORT))
        .collect();
    let list = web_in_both_families(&backends.iter().collect::<Vec<_>>());
    services.program(&list);
    for family in FAMILIES {
        let out_of_n2 = || n2.packets(action::TO_REMOTE_NODE) + n2.packets(action::TO_TUNNEL);
        let before = (n1.packets(action::TRANSLATED), out_of_n2());
        let mut picked: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..50 {
            let name = tcp_request(&client, SocketAddr::new(cluster_ip(family, 10), 80), 4096)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} connection {i}: {e}"));
            *picked.entry(name).or_default() += 1;
        }
        eprintln!("{mode:?} {family:?}: {picked:?}");
        for name in names {
            assert!(
                picked.get(name).copied().unwrap_or(0) > 0,
                "{mode:?} {family:?}: backend {name} got none of 50: {picked:?}"
            );
        }
        assert!(n1.packets(action::TRANSLATED) > before.0);
        // The remote backend's replies took n2's fast path out (routed, or
        // into the tunnel).
        assert!(out_of_n2() > before.1);
    }
}

/// A pod reaching itself through its own Service (kube-proxy masquerades
/// it), over TCP and UDP.
#[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
fn hairpin(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let n1 = services.node("n1");
    let pod = n1.pod();
    let _tcp = TcpBackend::start(&pod, "self", BACKEND_PORT);
    let _udp = UdpBackend::start(&pod, "self", DNS_PORT);
    let list: Vec<ServicePort> = FAMILIES
        .into_iter()
        .flat_map(|family| [web(family, &[&pod]), dns(family, &[&pod])])
        .collect();
    services.program(&list);
    for family in FAMILIES {
        let name = tcp_request(&pod, SocketAddr::new(cluster_ip(family, 10), 80), 64 << 10)
            .unwrap_or_else(|e| panic!("{mode:?} {family:?} hairpin TCP: {e}"));
        assert_eq!(name, "self");
        let name = udp_query(
            &pod,
            SocketAddr::new(cluster_ip(family, 53), DNS_PORT),
            "me",
        )
        .unwrap_or_else(|e| panic!("{mode:?} {family:?} hairpin UDP: {e}"));
        assert_eq!(name, "self");
    }
}

//! Egress through a ClusterIP (kube-proxy's DNAT in front of the policy) is
//! judged by the Service's backends.

use super::*;
use flatnet_harness::RecvThroughSignals;

/// A Service as the stub serves it: ClusterIP `ip`, ports (name, port,
/// protocol), and its EndpointSlice with the ready `backends` on
/// `target`.
fn api_service(namespace: &str, name: &str, ip: Ipv4Addr, ports: &[(&str, u16, Proto)]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(port_name, port, proto)| {
            json!({"name": port_name, "port": port, "protocol": proto.api(), "targetPort": 80})
        })
        .collect();
    json!({"metadata": {"namespace": namespace, "name": name},
           "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
                    "ports": ports}})
}

fn api_slice(
    namespace: &str,
    service: &str,
    ports: &[(&str, u16, Proto)],
    backends: &[Ipv4Addr],
) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(
            |(port_name, _, proto)| json!({"name": port_name, "port": 80, "protocol": proto.api()}),
        )
        .collect();
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}}))
        .collect();
    json!({"metadata": {"namespace": namespace, "name": format!("{service}-1"),
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4", "ports": ports, "endpoints": endpoints})
}

/// One port of a Service as kube-proxy programs it: `namespace/name`,
/// port `port_name`, backends on port 80.
fn kube_proxy_port(
    (namespace, name): (&str, &str),
    (port_name, port, proto): (&str, u16, Proto),
    ip: Ipv4Addr,
    backends: &[Ipv4Addr],
) -> kube_proxy_fixture::ServicePort {
    let protocol = match proto {
        Proto::Tcp => kube_proxy_fixture::Protocol::Tcp,
        Proto::Udp => kube_proxy_fixture::Protocol::Udp,
    };
    let mut service = kube_proxy_fixture::ServicePort::cluster_ip(
        name,
        IpAddr::V4(ip),
        port,
        protocol,
        backends
            .iter()
            .map(|b| SocketAddr::from((*b, 80)))
            .collect(),
    );
    service.namespace = namespace.into();
    service.port_name = port_name.into();
    service
}

/// Egress through a ClusterIP, after kube-proxy's DNAT (its iptables rules
/// from the fixture on both nodes), is judged by the Service's backends, as
/// upstream's tests with a Service as destination expect: x/a, allowed only
/// to z/c and y/a, reaches a DNS-like Service backed by z/c on UDP and TCP
/// 53, not a Service with a backend it may not reach (y/b) beside one it
/// may (y/a), until that backend leaves the Service's endpoints.
#[flatnet_test(root)]
fn egress_through_a_cluster_ip_is_judged_by_the_services_backends() {
    let cluster = cluster();
    let world = World::new(&cluster);
    let (dns_ip, web_ip) = (Ipv4Addr::new(10, 96, 0, 10), Ipv4Addr::new(10, 96, 0, 20));
    let dns_ports = [("dns", 53, Proto::Udp), ("dns-tcp", 53, Proto::Tcp)];
    let web_ports = [("web", 80, Proto::Tcp)];
    let (z_c, y_a, y_b) = (
        world.pod("z/c").ip,
        world.pod("y/a").ip,
        world.pod("y/b").ip,
    );
    let program = |web_backends: &[Ipv4Addr]| {
        let mut ports: Vec<_> = dns_ports
            .iter()
            .map(|p| kube_proxy_port(("z", "dns"), *p, dns_ip, &[z_c]))
            .collect();
        ports.push(kube_proxy_port(
            ("y", "web"),
            web_ports[0],
            web_ip,
            web_backends,
        ));
        world
            .cluster
            .program_kube_proxy(kube_proxy_fixture::Mode::Iptables, &ports);
        world.apply(|stub| {
            stub.add(Kind::Service, api_service("z", "dns", dns_ip, &dns_ports));
            stub.add(
                Kind::EndpointSlice,
                api_slice("z", "dns", &dns_ports, &[z_c]),
            );
            stub.add(Kind::Service, api_service("y", "web", web_ip, &web_ports));
            stub.add(
                Kind::EndpointSlice,
                api_slice("y", "web", &web_ports, web_backends),
            );
        });
    };
    program(&[y_a, y_b]);

    let from = |id: &str| world.pod(id).netns();
    // Through a Service with two backends: either may answer.
    let reaches_web = |id: &str| {
        let outcome = probe(&from(id), web_ip, 80, Proto::Tcp, "y/a");
        outcome == Outcome::Allowed || outcome == Outcome::Wrong("answered \"y/b\"".into())
    };
    // Without policy, the Services work from x/a (kube-proxy's DNAT).
    assert_eq!(
        probe(&from("x/a"), dns_ip, 53, Proto::Udp, "z/c"),
        Outcome::Allowed
    );
    assert_eq!(
        probe(&from("x/a"), dns_ip, 53, Proto::Tcp, "z/c"),
        Outcome::Allowed
    );
    assert!(reaches_web("x/a"));
    // And a closed UDP port answers with an ICMP port unreachable.
    assert!(
        udp_refused(&from("x/a"), z_c, CLOSED_PORT) && udp_refused(&from("x/a"), y_a, CLOSED_PORT),
        "without policy, UDP to a closed port was not refused"
    );

    world.apply(|stub| {
        stub.add(
            Kind::NetworkPolicy,
            policy(
                "x",
                "a-to-z-c-and-y-a",
                json!({"podSelector": only("a"), "policyTypes": ["Egress"],
                       "egress": [
                           {"to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}, "podSelector": only("c")}],
                            "ports": [{"protocol": "UDP", "port": 80}, {"protocol": "TCP", "port": 80}]},
                           {"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": only("a")}],
                            "ports": [{"protocol": "TCP", "port": 80}]}]}),
            ),
        );
    });
    let expect = |what: &str, outcome: Outcome, want: Outcome| {
        assert_eq!(outcome, want, "{what}");
    };
    // The DNS Service's only backend is allowed: its ClusterIP is, on the
    // Service's ports, both protocols.
    expect(
        "x/a -> dns UDP 53",
        probe(&from("x/a"), dns_ip, 53, Proto::Udp, "z/c"),
        Outcome::Allowed,
    );
    expect(
        "x/a -> dns TCP 53",
        probe(&from("x/a"), dns_ip, 53, Proto::Tcp, "z/c"),
        Outcome::Allowed,
    );
    // Directly: what the policy says of each pod.
    expect(
        "x/a -> z/c UDP 80",
        probe(&from("x/a"), z_c, 80, Proto::Udp, "z/c"),
        Outcome::Allowed,
    );
    expect(
        "x/a -> y/a TCP 80",
        probe(&from("x/a"), y_a, 80, Proto::Tcp, "y/a"),
        Outcome::Allowed,
    );
    expect(
        "x/a -> y/b TCP 80",
        probe(&from("x/a"), y_b, 80, Proto::Tcp, "y/b"),
        Outcome::Denied,
    );
    // One backend of web is not allowed: web's ClusterIP is denied.
    expect(
        "x/a -> web TCP 80",
        probe(&from("x/a"), web_ip, 80, Proto::Tcp, "y/a"),
        Outcome::Denied,
    );
    // x/b, selected by no policy, still reaches both Services.
    assert!(reaches_web("x/b"));
    expect(
        "x/b -> dns UDP 53",
        probe(&from("x/b"), dns_ip, 53, Proto::Udp, "z/c"),
        Outcome::Allowed,
    );

    // y/b leaves web's endpoints (kube-proxy's rules and the slice): every
    // backend left is allowed, so the ClusterIP is too.
    program(&[y_a]);
    expect(
        "x/a -> web TCP 80 (y/a only)",
        probe(&from("x/a"), web_ip, 80, Proto::Tcp, "y/a"),
        Outcome::Allowed,
    );
    // The Service's target port is not a port of the ClusterIP.
    expect(
        "x/a -> dns UDP 80",
        probe(&from("x/a"), dns_ip, 80, Proto::Udp, "z/c"),
        Outcome::Denied,
    );

    // Related ICMP: UDP to a closed port of z/c (x/a's node) and of y/a
    // (the other node) is refused by an ICMP port unreachable, with and
    // without policy alike. With x/a isolated for ingress too (nothing may
    // come in), the error passes as part of the flow x/a opened.
    let refused = |to: Ipv4Addr| udp_refused(&from("x/a"), to, CLOSED_PORT);
    world.apply(|stub| {
        stub.add(
            Kind::NetworkPolicy,
            policy(
                "x",
                "a-closed-port-only-in-nothing",
                json!({"podSelector": only("a"), "policyTypes": ["Ingress", "Egress"],
                       "egress": [{"ports": [{"protocol": "UDP", "port": CLOSED_PORT}]}]}),
            ),
        );
    });
    assert!(
        refused(z_c),
        "the port unreachable of z/c (same node) did not get into x/a"
    );
    assert!(
        refused(y_a),
        "the port unreachable of y/a (other node) did not get into x/a"
    );
    // Nothing else comes in: x/b's probe of x/a times out.
    assert_eq!(
        probe(&from("x/b"), world.pod("x/a").ip, 80, Proto::Udp, "x/a"),
        Outcome::Denied
    );
    let drops = world.metric_of_nodes("flatnet_policy_errors_total");
    assert!(drops.iter().all(|e| *e == 0.0), "policy errors: {drops:?}");
}

/// A UDP port no pod serves.
const CLOSED_PORT: u16 = 9;

/// Whether a datagram from the pod at `from` to `to`:`port` is refused
/// (the ICMP port unreachable reached the socket) within the probe timeout;
/// false when nothing came back.
fn udp_refused(from: &Path, to: Ipv4Addr, port: u16) -> bool {
    let from = from.to_path_buf();
    std::thread::spawn(move || {
        enter_thread(&from).expect("setns");
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
        socket.set_read_timeout(Some(PROBE_TIMEOUT)).unwrap();
        socket.connect((to, port)).expect("connect");
        (0..3).any(|_| {
            let _ = socket.send(b"probe");
            let mut buf = [0u8; 64];
            matches!(socket.recv_through_signals(&mut buf), Err(e) if e.kind() == ErrorKind::ConnectionRefused)
        })
    })
    .join()
    .expect("probe thread")
}

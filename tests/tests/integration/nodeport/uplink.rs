//! Outside clients reach NodePorts over IPv4 through the uplink program:
//! both externalTrafficPolicy values, health checks, a restarted agent,
//! and a backend on another node through the VXLAN tunnel.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use flatnet_common::{action, external_port};
use flatnet_datapath::bpf::{Outside, service_key};
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;

use crate::socket_lb::api::BACKEND_PORT;

use super::exchanges::{Echo, tcp_answers, tcp_ask, udp_ask};
use super::fixture::{
    NODE_PORT, OUTSIDE, assert_served_in_bpf, node_port_service, node_port_slice,
    two_nodes_and_outside, two_nodes_and_outside_flagged,
};

/// A health check's GET from `netns` to `to`: the status and the JSON body.
fn health_check(netns: &Netns, to: SocketAddr) -> Option<(u16, serde_json::Value)> {
    let reply = netns.run(|| -> std::io::Result<String> {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(3)))?;
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")?;
        let mut reply = String::new();
        conn.read_to_string(&mut reply)?;
        Ok(reply)
    });
    let reply = reply.ok()?;
    let status = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split("\r\n\r\n").nth(1)?;
    Some((status, serde_json::from_str(body).ok()?))
}

/// kube-proxy absent: a client outside the cluster reaches a NodePort on
/// either node. With `externalTrafficPolicy: Cluster` each node spreads
/// the flows over both backends (the one on the node straight into the
/// pod, the other's out of the uplink), the backends see the node's
/// address as the source (kube-proxy's masquerade) and the replies come
/// back from the NodePort, TCP and UDP; the uplink program counts each
/// way and the translation table holds the flows. With `Local`, each node
/// serves only its own backend and the client's address is kept. A port
/// that is no NodePort's is left to the node (refused).
#[flatnet_test(root)]
fn clients_outside_reach_node_ports_through_the_uplink() {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let outside = &cluster._switch;
    let (local, remote) = (cp.pod(), worker.pod());
    let _servers = [
        Echo::start(&local.netns, "local"),
        Echo::start(&remote.netns, "remote"),
    ];
    stub.add(
        Kind::Service,
        node_port_service("np", Ipv4Addr::new(10, 96, 9, 30), NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        node_port_slice("np", &[(local.ip, "cp-1"), (remote.ip, "worker-1")]),
    );
    let wildcard = Ipv4Addr::UNSPECIFIED.into();
    let serving = |node: &SimNode, outside_mode: Outside| {
        let datapath = node.datapath();
        let ports = datapath.external_port_bits().unwrap();
        ports.contains(&(
            NODE_PORT,
            external_port::NODEPORT_TCP | external_port::NODEPORT_UDP,
        )) && [6, 17].into_iter().all(|protocol| {
            datapath
                .service_frontends()
                .unwrap()
                .iter()
                .any(|(key, value)| {
                    *key == service_key(wildcard, NODE_PORT, protocol)
                        && value.count == 2
                        && Outside::of(value) == outside_mode
                })
        })
    };
    wait_until("both agents to serve the NodePort", SETTLE, || {
        serving(cp, Outside::Cluster) && serving(worker, Outside::Cluster)
    });

    let cp_port = SocketAddr::from((cp.spec.address(), NODE_PORT));
    let worker_port = SocketAddr::from((worker.spec.address(), NODE_PORT));
    // Cluster: both backends through either node, the node's address seen.
    for (node, to) in [(cp, cp_port), (worker, worker_port)] {
        let seen_from = node.spec.address();
        assert_eq!(
            tcp_answers(outside, to, 16),
            BTreeSet::from([format!("local {seen_from}"), format!("remote {seen_from}")]),
            "TCP from outside to {to}"
        );
        let answers: BTreeSet<String> = (0..16)
            .map(|_| {
                let (answer, from) =
                    udp_ask(outside, to).unwrap_or_else(|e| panic!("UDP to {to}: {e}"));
                assert_eq!(from, to, "a UDP answer's source");
                answer
            })
            .collect();
        assert_eq!(
            answers,
            BTreeSet::from([format!("local {seen_from}"), format!("remote {seen_from}")]),
            "UDP from outside to {to}"
        );
    }
    assert_served_in_bpf(cp, "IPv4");
    let flows = cp.datapath().nat_flows().unwrap();
    assert!(
        flows
            .iter()
            .any(|f| f.frontend == cp_port && f.nat_port.is_some()),
        "cp-1's translation table: {flows:?}"
    );
    // Not a NodePort: the node's own (nothing listens, refused).
    assert!(
        tcp_ask(
            outside,
            SocketAddr::from((cp.spec.address(), NODE_PORT + 1))
        )
        .is_err()
    );

    // A live connection outlives cp-1's agent: the tables are pinned. The
    // restarted agent's collection counts the flows and forgets none of
    // these (none is idle past its timeout).
    let live = outside.run(|| {
        let mut conn = TcpStream::connect_timeout(&cp_port, Duration::from_secs(2)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        conn.write_all(b"before").unwrap();
        conn
    });
    cp.stop_agent();
    cp.start_agent(&Peers::Api(served[0].url.clone()));
    cp.wait_ready();
    let mut live = live;
    live.write_all(b" after the restart")
        .expect("the live connection after the restart");
    live.shutdown(Shutdown::Write)
        .expect("the live connection after the restart");
    let mut answer = String::new();
    live.read_to_string(&mut answer)
        .expect("the live connection's answer");
    assert!(answer.ends_with(&cp.spec.address().to_string()), "{answer}");
    // The flows still within their idle timeout stay, and are counted. A
    // closed TCP flow's timeout is 60 s, which a loaded machine can take to
    // get here (the restarted agent has 60 s to be ready): such a flow may
    // be forgotten by then, as the kernel's conntrack would.
    let within_timeout = || {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| Duration::from(t).as_nanos() as u64)
            .unwrap();
        flows
            .iter()
            .filter(|f| {
                let idle = Duration::from_nanos(now.saturating_sub(f.last_ns));
                !flatnet_agent::services::nat::expired(f.protocol, f.closing, idle)
            })
            .map(|f| (f.protocol, f.client, f.frontend))
            .collect::<BTreeSet<_>>()
    };
    // What was seen last, for the failure's message.
    let mut seen = String::new();
    let counted = poll_until(SETTLE, Duration::from_millis(200), || {
        let page = cp.metrics();
        let must_stay = within_timeout();
        let table = cp.datapath().nat_flows().unwrap();
        let in_table: BTreeSet<_> = table
            .iter()
            .map(|f| (f.protocol, f.client, f.frontend))
            .collect();
        let metric = |name| kube_stub::metric(&page, name);
        let (count, max, expired) = (
            metric("flatnet_nat_flows"),
            metric("flatnet_nat_flows_max"),
            metric("flatnet_nat_expired_total"),
        );
        seen = format!(
            "flows before the restart {}, {} of them within their timeout; table now {table:?}; flatnet_nat_flows {count:?}, _max {max:?}, flatnet_nat_expired_total {expired:?}",
            flows.len(),
            must_stay.len()
        );
        must_stay.is_subset(&in_table)
            && count.is_some_and(|n| n >= must_stay.len() as f64)
            && max == Some(f64::from(flatnet_common::MAX_NAT_FLOWS))
            && expired.is_some_and(|n| n <= (flows.len() - must_stay.len()) as f64)
    });
    assert!(
        counted,
        "cp-1's restarted agent did not count the translated flows within {SETTLE:?}: {seen}"
    );

    // Local: each node's own backend, the client's address kept.
    stub.modify(Kind::Service, "default/np", |service| {
        service["spec"]["externalTrafficPolicy"] = "Local".into();
    });
    wait_until(
        "both agents to keep clients on local backends",
        SETTLE,
        || serving(cp, Outside::Local(1)) && serving(worker, Outside::Local(1)),
    );
    for (to, name) in [(cp_port, "local"), (worker_port, "remote")] {
        assert_eq!(
            tcp_answers(outside, to, 8),
            BTreeSet::from([format!("{name} {OUTSIDE}")]),
            "TCP from outside to {to}, externalTrafficPolicy Local"
        );
        let (answer, from) = udp_ask(outside, to).unwrap_or_else(|e| panic!("UDP to {to}: {e}"));
        assert_eq!((answer, from), (format!("{name} {OUTSIDE}"), to));
    }

    assert!(
        cp.datapath()
            .nat_flows()
            .unwrap()
            .iter()
            .any(|f| f.protocol == 17 && f.backend == SocketAddr::from((local.ip, BACKEND_PORT))),
        "cp-1 holds no UDP flow to its own backend"
    );

    // healthCheckNodePort (a LoadBalancer with Local): each node says how
    // many endpoints it has; a node left without one says 503 and drops
    // what outside clients still send it, as kube-proxy does.
    const HEALTH_PORT: u16 = 32000;
    stub.modify(Kind::Service, "default/np", |service| {
        service["spec"]["type"] = "LoadBalancer".into();
        service["spec"]["healthCheckNodePort"] = HEALTH_PORT.into();
    });
    let health = |node: &SimNode| {
        health_check(
            outside,
            SocketAddr::from((node.spec.address(), HEALTH_PORT)),
        )
    };
    wait_until("both nodes' health checks to answer", SETTLE, || {
        [cp, worker].iter().all(|node| {
            health(node).is_some_and(|(status, body)| status == 200 && body["localEndpoints"] == 1)
        })
    });
    let (_, body) = health(cp).unwrap();
    assert_eq!(body["service"]["name"], "np");
    stub.modify(Kind::EndpointSlice, "default/np-1", |slice| {
        slice["endpoints"]
            .as_array_mut()
            .unwrap()
            .retain(|e| e["nodeName"] == "worker-1");
    });
    wait_until("cp-1's health check to fail", SETTLE, || {
        health(cp).is_some_and(|(status, body)| status == 503 && body["localEndpoints"] == 0)
    });
    // Its UDP flows to the backend that left are forgotten (kube-proxy
    // clears their conntrack entries); TCP flows end with their connections.
    let local_backend = SocketAddr::from((local.ip, BACKEND_PORT));
    wait_until(
        "cp-1 to forget UDP flows to the departed backend",
        SETTLE,
        || {
            !cp.datapath()
                .nat_flows()
                .unwrap()
                .iter()
                .any(|f| f.protocol == 17 && f.backend == local_backend)
        },
    );
    assert!(
        tcp_ask(outside, cp_port).is_err(),
        "cp-1 served an outside client with no endpoint of its own"
    );
    assert!(cp.packets(action::NODEPORT_DROPPED) > 0);
    assert_eq!(
        tcp_answers(outside, worker_port, 4),
        BTreeSet::from([format!("remote {OUTSIDE}")])
    );
    for node in &cluster.nodes {
        node.stop_agent();
        node.datapath().detach_services().unwrap();
    }
    // The health check servers stop with their agent.
    assert!(health(cp).is_none());
}

/// Nodes tunnelled (`--routing vxlan`): an outside client's NodePort flow
/// through cp-1 to a backend on worker-1 goes into the tunnel translated
/// (the node's address and port as its source), and the replies come
/// back out of it to be translated back, TCP and UDP.
#[flatnet_test(root)]
fn node_ports_reach_a_remote_backend_through_the_tunnel() {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) = two_nodes_and_outside_flagged(&cgroup, &stub, &["--routing", "vxlan"]);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    assert!(
        cp.remote_cidrs().iter().any(|r| r.contains("vxlan")),
        "cp-1 does not tunnel: {:?}",
        cp.remote_cidrs()
    );
    let outside = &cluster._switch;
    let remote = worker.pod();
    let _server = Echo::start(&remote.netns, "remote");
    stub.add(
        Kind::Service,
        node_port_service("tunnelled", Ipv4Addr::new(10, 96, 9, 70), NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        node_port_slice("tunnelled", &[(remote.ip, "worker-1")]),
    );
    let wildcard = Ipv4Addr::UNSPECIFIED.into();
    wait_until("cp-1's agent to serve the NodePort", SETTLE, || {
        [6, 17].into_iter().all(|protocol| {
            cp.datapath()
                .service_backends(&service_key(wildcard, NODE_PORT, protocol))
                .ok()
                .flatten()
                .is_some_and(|set| set.len() == 1)
        })
    });
    let to = SocketAddr::from((cp.spec.address(), NODE_PORT));
    let seen = format!("remote {}", cp.spec.address());
    let tunnelled_before = cp.packets(action::NODEPORT_TO_NODE);
    for _ in 0..8 {
        assert_eq!(tcp_ask(outside, to).expect("TCP through the tunnel"), seen);
        assert_eq!(
            udp_ask(outside, to).expect("UDP through the tunnel"),
            (seen.clone(), to)
        );
    }
    assert!(cp.packets(action::NODEPORT_TO_NODE) > tunnelled_before);
    assert!(cp.packets(action::NODEPORT_REPLIED) > 0);
}

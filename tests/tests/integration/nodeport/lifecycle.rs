//! Live NodePort connections from outside outlive changes to the node: a
//! datapath upgrade with an agent restart, and their Service's deletion.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use flatnet_common::{action, external_port};
use flatnet_datapath::bpf::service_key;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;

use crate::socket_lb::api::{BACKEND_PORT, api_slice};

use super::exchanges::tcp_ask;
use super::fixture::{NODE_PORT, tcp_node_port_service, two_nodes_and_outside};

/// Live NodePort connections from outside outlive a datapath upgrade of
/// the node they entered by: a stream to a backend on cp-1 and one to a
/// backend on worker-1 (both through cp-1's NodePorts) keep every byte
/// while cp-1's pinned programs are made to look like an older build's,
/// the next ADD loads this build's and moves every veth and the uplink
/// over (the translation tables and the tail-call array are pinned and
/// kept), and cp-1's agent restarts.
#[flatnet_test(root)]
fn node_port_streams_from_outside_survive_a_datapath_upgrade() {
    use crate::services::TcpBackend;
    use crate::services::under_load::{age_pinned_programs, echo_stream_during, program_ids};

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let outside = &cluster._switch;
    let (near, far) = (cp.pod(), worker.pod());
    let _servers = [
        TcpBackend::start(&near, "near", BACKEND_PORT),
        TcpBackend::start(&far, "far", BACKEND_PORT),
    ];
    let ports = [
        (NODE_PORT + 1, &near, "cp-1"),
        (NODE_PORT + 2, &far, "worker-1"),
    ];
    for (i, (port, pod, node)) in ports.iter().enumerate() {
        let name = format!("stream{i}");
        stub.add(
            Kind::Service,
            tcp_node_port_service(&name, Ipv4Addr::new(10, 96, 9, 60 + i as u8), *port),
        );
        stub.add(Kind::EndpointSlice, api_slice(&name, &[(pod.ip, node)]));
    }
    let wildcard = Ipv4Addr::UNSPECIFIED.into();
    wait_until("cp-1's agent to serve both NodePorts", SETTLE, || {
        ports.iter().all(|(port, _, _)| {
            cp.datapath()
                .service_backends(&service_key(wildcard, *port, 6))
                .ok()
                .flatten()
                .is_some_and(|set| set.len() == 1)
        })
    });
    let before = program_ids(cp);
    let datapath = cp.datapath();
    let mut third = None;
    let to = |port: u16| SocketAddr::from((cp.spec.address(), port));
    let ((sent, echoed), (sent_far, echoed_far)) = std::thread::scope(|scope| {
        let far_stream = scope
            .spawn(|| echo_stream_during(outside, to(ports[1].0), Duration::from_secs(10), || {}));
        let near_stream =
            echo_stream_during(outside, to(ports[0].0), Duration::from_secs(10), || {
                age_pinned_programs(&datapath);
                third = Some(cp.pod());
                cp.stop_agent();
                cp.start_agent(&Peers::Api(served[0].url.clone()));
                cp.wait_ready();
            });
        (near_stream, far_stream.join().expect("far stream"))
    });
    for (what, sent, echoed) in [("near", sent, echoed), ("far", sent_far, echoed_far)] {
        assert_eq!(sent, echoed, "{what}: bytes lost");
        assert!(
            sent > 1 << 20,
            "{what}: the stream barely moved: {sent} bytes"
        );
    }
    let after = program_ids(cp);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a != b),
        "no new programs were loaded ({before:?} -> {after:?})"
    );
    assert!(cp.packets(action::NODEPORT_REPLIED) > 0);
    drop(third);
}

/// A Service deleted (its NodePort gone) leaves its established TCP
/// connections from outside be, as kube-proxy's conntrack carries them on:
/// the agent holds the port's bits while the flow lives; a new connection
/// finds no frontend and is refused; once the connection closes, the
/// next resync lets the port go.
#[flatnet_test(root)]
fn an_established_connection_outlives_its_services_deletion() {
    use crate::services::TcpBackend;

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let outside = &cluster._switch;
    let (near, far) = (cp.pod(), worker.pod());
    let _servers = [
        TcpBackend::start(&near, "near", BACKEND_PORT),
        TcpBackend::start(&far, "far", BACKEND_PORT),
    ];
    stub.add(
        Kind::Service,
        tcp_node_port_service("going", Ipv4Addr::new(10, 96, 9, 80), NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        api_slice("going", &[(near.ip, "cp-1"), (far.ip, "worker-1")]),
    );
    let key = service_key(Ipv4Addr::UNSPECIFIED.into(), NODE_PORT, 6);
    let frontend_there = || {
        cp.datapath()
            .service_frontends()
            .unwrap()
            .iter()
            .any(|(k, _)| *k == key)
    };
    // Both backends written: the Service may land before its EndpointSlice,
    // and a frontend without backends refuses connections.
    wait_until("cp-1's agent to serve the NodePort", SETTLE, || {
        cp.datapath()
            .service_backends(&key)
            .ok()
            .flatten()
            .is_some_and(|set| set.len() == 2)
    });
    let to = SocketAddr::from((cp.spec.address(), NODE_PORT));
    // Connections to both backends (each a new flow, chosen at random).
    let mut conns = Vec::new();
    let mut seen = BTreeSet::new();
    while seen.len() < 2 {
        let mut conn = outside
            .run(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)))
            .expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut banner = [0u8; 5];
        let n = conn.read_through_signals(&mut banner).expect("the banner");
        let name = String::from_utf8_lossy(&banner[..n]).trim().to_string();
        if seen.insert(name.clone()) {
            conns.push((name, conn));
        }
        assert!(seen.len() == 2 || conns.len() < 2);
    }
    stub.delete(Kind::Service, "default/going");
    wait_until("cp-1's agent to remove the NodePort", SETTLE, || {
        !frontend_there()
    });
    // The port held, the connections alive both ways.
    let bits = |port: u16| {
        cp.datapath()
            .external_port_bits()
            .unwrap()
            .into_iter()
            .find(|(p, _)| *p == port)
            .map_or(0, |(_, bits)| bits & external_port::SERVICE_BITS)
    };
    assert_eq!(bits(NODE_PORT), external_port::NODEPORT_TCP);
    assert_ne!(bits(external_port::ANY_PORT), 0);
    for (name, conn) in &mut conns {
        conn.write_all(b"still there")
            .expect("writing after the deletion");
        let mut echo = [0u8; 11];
        conn.read_exact(&mut echo)
            .unwrap_or_else(|e| panic!("{name}'s echo after the deletion: {e}"));
        assert_eq!(&echo, b"still there");
    }
    // A new connection finds no frontend.
    let refused = tcp_ask(outside, to);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    // Closed: the port goes at a resync (every 2 s here).
    for (_, conn) in conns {
        conn.shutdown(Shutdown::Both).unwrap();
    }
    wait_until("cp-1's agent to let the port go", SETTLE, || {
        bits(NODE_PORT) == 0 && bits(external_port::ANY_PORT) == 0
    });
}

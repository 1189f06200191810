//! Node ports are given back and kept apart: closed and reset flows free
//! their ports at once, a client reopening its port gets a flow of its
//! own, and many clients at once never share one.

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

use super::exchanges::Echo;
use super::fixture::{NODE_PORT, tcp_node_port_service, two_nodes_and_outside};

/// Node ports are scarce (4,536 per node address, backend and protocol):
/// a closed flow gives its own back. From outside through cp-1 to a
/// NodePort whose one backend is on worker-1, faster than the agent
/// collects them: 6,000 short connections closed by FINs both ways, then
/// 6,000 reset by the client as soon as they are up (the services
/// benchmark's client resets its connections; these come faster than
/// 4,536 a second, so a reset flow must give its port back at once). All
/// get through, and none is dropped for want of a port.
#[flatnet_test(root)]
fn closed_flows_give_their_node_ports_back() {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let outside = &cluster._switch;
    // A pod on cp-1 too: its ADD turns forwarding on there, as on a node
    // that runs pods.
    let (_bystander, remote) = (cp.pod(), worker.pod());
    let _server = Echo::start(&remote.netns, "remote");
    let to = serve_one_tcp_node_port(&stub, cp, remote.ip);
    let dropped_before = cp.packets(action::NODEPORT_DROPPED);
    let failures = outside.run(|| {
        let mut failures = Vec::new();
        for (i, reset) in (0..12000).map(|i| (i, i >= 6000)) {
            let outcome = (|| -> std::io::Result<()> {
                let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
                if reset {
                    socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO))?;
                    return Ok(());
                }
                conn.set_read_timeout(Some(Duration::from_secs(3)))?;
                conn.write_all(b"x")?;
                conn.shutdown(Shutdown::Write)?;
                let mut answer = String::new();
                conn.read_to_string(&mut answer)?;
                Ok(())
            })();
            if let Err(e) = outcome {
                failures.push(format!("connection {i} (reset: {reset}): {e}"));
            }
        }
        failures
    });
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(cp.packets(action::NODEPORT_DROPPED), dropped_before);
    assert!(cp.packets(action::NODEPORT_TO_NODE) >= 12000);
    for node in &cluster.nodes {
        node.stop_agent();
        node.datapath().detach_services().unwrap();
    }
}

/// A TCP NodePort (`NODE_PORT`) whose one backend is `backend` on
/// worker-1, once cp-1 serves it: its address there.
fn serve_one_tcp_node_port(stub: &ApiStub, cp: &SimNode, backend: Ipv4Addr) -> SocketAddr {
    stub.add(
        Kind::Service,
        tcp_node_port_service("one", Ipv4Addr::new(10, 96, 9, 32), NODE_PORT),
    );
    stub.add(
        Kind::EndpointSlice,
        api_slice("one", &[(backend, "worker-1")]),
    );
    let key = service_key(Ipv4Addr::UNSPECIFIED.into(), NODE_PORT, 6);
    wait_until("cp-1 to serve the NodePort", SETTLE, || {
        cp.datapath()
            .service_backends(&key)
            .unwrap()
            .is_some_and(|set| set.len() == 1)
            && cp
                .datapath()
                .external_port_bits()
                .unwrap()
                .contains(&(NODE_PORT, external_port::NODEPORT_TCP))
    });
    SocketAddr::from((cp.spec.address(), NODE_PORT))
}

/// A TCP connection to `to` from `port` of the namespace the thread is in
/// (the port reused at once: `SO_REUSEADDR`).
fn connect_from(port: u16, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(3))?;
    let conn = TcpStream::from(socket);
    conn.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(conn)
}

/// A client that reuses its port for a new connection, right after its
/// last one on that port was reset, or closed by FINs both ways, gets a new
/// flow, as conntrack gives a SYN that reopens a closed connection's tuple
/// a new entry: the old flow's closing marks must not stay on the new
/// connection, where they said its node port was free for another client's
/// new flow while it was in use (under many clients at once, a connection
/// then lost its replies to, and was reset by, the other one). The old
/// flow's way back, which no flow leads to any more, is what the agent's
/// collector forgets, and forgetting it leaves the new connection whole.
/// Outside through cp-1, the backend on worker-1.
#[flatnet_test(root)]
fn a_client_reopening_its_port_gets_a_flow_of_its_own() {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let (_bystander, remote) = (cp.pod(), worker.pod());
    let _server = Echo::start(&remote.netns, "remote");
    let to = serve_one_tcp_node_port(&stub, cp, remote.ip);
    // The outside host (the switch namespace, the test's own) reuses
    // ports in TIME_WAIT for any destination, not only loopback.
    cluster
        ._switch
        .exec(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"]);
    let flows_of = |port: u16| -> Vec<_> {
        cp.datapath()
            .nat_flows()
            .unwrap()
            .into_iter()
            .filter(|flow| flow.client.port() == port)
            .collect()
    };
    for (port, reset) in [(41001, true), (41002, false)] {
        let answer = cluster._switch.run(|| -> std::io::Result<String> {
            let mut first = connect_from(port, to)?;
            first.write_all(b"first")?;
            let old_port = flows_of(port)[0].nat_port;
            if reset {
                socket2::SockRef::from(&first).set_linger(Some(Duration::ZERO))?;
            } else {
                // Closed both ways: the client's end waits in TIME_WAIT,
                // which `tcp_tw_reuse` lets a new connect() take after
                // `tcp_tw_reuse_delay` (1 s).
                first.shutdown(Shutdown::Write)?;
                first.read_to_string(&mut String::new())?;
            }
            drop(first);
            if !reset {
                std::thread::sleep(Duration::from_millis(1200));
            }
            let mut second = connect_from(port, to)?;
            second.write_all(b"second")?;
            // Up, its request sent, not yet closed: the flow is live.
            std::thread::sleep(Duration::from_millis(200));
            let live = flows_of(port);
            assert_eq!(live.len(), 1, "reset: {reset}: {live:?}");
            assert!(
                !live[0].closing,
                "reset: {reset}: a live connection marked closing: {live:?}"
            );
            // The old flow's way back is left to the collector (or a new
            // flow taking its port), and only that: forgetting every way
            // back no flow leads to keeps the live connection whole.
            let flows = cp.datapath().nat_flows().unwrap();
            let orphans = cp.datapath().orphan_nat_replies(&flows).unwrap();
            assert!(orphans.iter().all(|o| o.closing), "{orphans:?}");
            if live[0].nat_port != old_port {
                assert_eq!(orphans.len(), 1, "reset: {reset}: {orphans:?}");
            }
            for orphan in &orphans {
                cp.datapath().forget_orphan_nat_reply(orphan).unwrap();
            }
            second.shutdown(Shutdown::Write)?;
            let mut answer = String::new();
            second.read_to_string(&mut answer)?;
            Ok(answer)
        });
        assert_eq!(
            answer.expect("the second connection"),
            format!("remote {}", cp.spec.address()),
            "reset: {reset}"
        );
    }
    for node in &cluster.nodes {
        node.stop_agent();
        node.datapath().detach_services().unwrap();
    }
}

/// Many outside clients at once through cp-1's NodePort (the backend on
/// worker-1): 4 of them, 10,000 connections each, each a 64-byte exchange
/// reset by its client at once, as the Services benchmark's are. The
/// node's CPUs translate new flows side by side, and after ~28,000
/// connections the clients' ports come round again while their old flows
/// are still in the maps. Every exchange is answered, to the client that
/// asked, and none is dropped for want of a port. (Before 73d8cf1, 1 to 5
/// of the 40,000 failed in each of 3 runs: a reopened client port kept its
/// old flow's closing marks, and another client's new flow took its node
/// port while it was in use.)
#[flatnet_test(root)]
fn many_clients_at_once_keep_their_flows_apart() {
    const CLIENTS: usize = 4;
    const CONNECTIONS: usize = 10000;
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let (_bystander, remote) = (cp.pod(), worker.pod());
    let _server = ExchangeServer::start(&remote.netns, BACKEND_PORT, 64, CLIENTS);
    let to = serve_one_tcp_node_port(&stub, cp, remote.ip);
    let dropped_before = cp.packets(action::NODEPORT_DROPPED);
    let outside = &cluster._switch;
    let failures: Vec<String> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                scope.spawn(move || {
                    outside.run(|| {
                        let mut failures = Vec::new();
                        for i in 0..CONNECTIONS {
                            // What this connection sends, and must get back.
                            let mut request = [0u8; 64];
                            request[..16].copy_from_slice(
                                &((client * CONNECTIONS + i) as u128).to_be_bytes(),
                            );
                            let outcome = (|| -> std::io::Result<()> {
                                let mut conn =
                                    TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
                                conn.set_read_timeout(Some(Duration::from_secs(3)))?;
                                conn.write_all(&request)?;
                                let mut answer = [0u8; 64];
                                conn.read_exact(&mut answer)?;
                                if answer != request {
                                    return Err(std::io::Error::other("another client's answer"));
                                }
                                socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO))
                            })();
                            if let Err(e) = outcome {
                                failures.push(format!("client {client}, connection {i}: {e}"));
                            }
                        }
                        failures
                    })
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|client| client.join().expect("a client thread"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} failed: {:?}",
        failures.len(),
        CLIENTS * CONNECTIONS,
        &failures[..failures.len().min(5)]
    );
    assert_eq!(cp.packets(action::NODEPORT_DROPPED), dropped_before);
    for node in &cluster.nodes {
        node.stop_agent();
        node.datapath().detach_services().unwrap();
    }
}

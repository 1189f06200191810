//! NodePorts for clients outside the cluster, served by the uplink program
//! with kube-proxy absent (`--services ebpf`): the flow translated to a
//! backend on this node or another, its replies translated back, and
//! `externalTrafficPolicy` as kube-proxy applies it. The outside client is
//! the simulated underlay's switch namespace, given an address on the
//! nodes' segment: a host on the same network as the nodes, as a load
//! balancer or a user's machine would be.

use flatnet_harness::RecvThroughSignals;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flatnet_common::{action, external_port};
use flatnet_datapath::bpf::{Outside, service_key};
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::path_report::{ipv6_path_report, udp_exchange};
use flatnet_tests::*;

use crate::socket_lb::{
    BACKEND_PORT, api_service, api_slice, ebpf_services_cluster_flagged, ebpf_services_cluster_of,
};

const NODE_PORT: u16 = 30080;
/// A NodePort whose backends' port nothing listens on.
const CLOSED_NODE_PORT: u16 = NODE_PORT + 3;
const CLOSED_BACKEND_PORT: u16 = BACKEND_PORT + 1;
/// A UDP NodePort whose backends answer late (`LateUdp`).
const LATE_NODE_PORT: u16 = NODE_PORT + 4;
const LATE_BACKEND_PORT: u16 = BACKEND_PORT + 2;
/// How late `LateUdp` answers.
const LATE_BY: Duration = Duration::from_millis(300);

/// A UDP server in a pod that answers each datagram `LATE_BY` after it
/// came: time for a client to have closed its socket, so its kernel
/// answers the answer with a port unreachable. Both families on one
/// socket. Stopped on drop.
struct LateUdp {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LateUdp {
    fn start(netns: &Netns) -> Self {
        let socket = netns.run(|| {
            UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, LATE_BACKEND_PORT)).expect("udp bind")
        });
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Room for `LARGE_DATAGRAM`.
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((len, peer)) = socket.recv_from_through_signals(&mut buf) {
                        std::thread::sleep(LATE_BY);
                        let _ = socket.send_to(&buf[..len], peer);
                    }
                }
            })
        };
        LateUdp {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for LateUdp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// ICMP (or ICMPv6) destination unreachables the netns has received.
fn dest_unreachables_received(netns: &Netns, family: Family) -> u64 {
    let counter = match family {
        Family::V4 => "IcmpInDestUnreachs",
        Family::V6 => "Icmp6InDestUnreachs",
    };
    let shown = netns.exec(&["nstat", "-az", counter]);
    shown
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(counter)).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {counter} in {shown}"))
}
pub(crate) const OUTSIDE: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 100);
/// The outside client's IPv6 address on the nodes' segment.
const OUTSIDE6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 0x64);

/// The family a side-by-side run reaches NodePorts over: which node
/// addresses, which client address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn node(self, node: &SimNode) -> std::net::IpAddr {
        match self {
            Family::V4 => node.spec.address().into(),
            Family::V6 => node.spec.address6().into(),
        }
    }

    fn outside(self) -> std::net::IpAddr {
        match self {
            Family::V4 => OUTSIDE.into(),
            Family::V6 => OUTSIDE6.into(),
        }
    }

    fn unspecified(self) -> std::net::IpAddr {
        match self {
            Family::V4 => Ipv4Addr::UNSPECIFIED.into(),
            Family::V6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
        }
    }
}

/// The path MTU `netns`'s kernel knows toward `to` (IPv6), if it learned one.
fn path_mtu(netns: &Netns, to: SocketAddr) -> Option<u32> {
    let route = netns.exec(&["ip", "-6", "route", "get", &to.ip().to_string()]);
    let mut words = route.split_whitespace();
    words.find(|word| *word == "mtu")?;
    words.next()?.parse().ok()
}

/// TCP and UDP servers in a pod answering with their name and the source
/// address they saw ("local 172.30.0.1"); stopped on drop.
pub(crate) struct Echo {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Echo {
    pub(crate) fn start(netns: &Netns, name: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        // Both families on one socket each (IPV6_V6ONLY off, Linux's
        // default); an IPv4 peer shows as ::ffff:a.b.c.d, printed as IPv4.
        let bind = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, BACKEND_PORT));
        let (tcp, udp) = netns.run(|| {
            (
                TcpListener::bind(bind).expect("tcp bind"),
                UdpSocket::bind(bind).expect("udp bind"),
            )
        });
        tcp.set_nonblocking(true).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let tcp_thread = {
            let (stop, name) = (stop.clone(), name.to_string());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((mut conn, peer)) => {
                            conn.set_nonblocking(false).unwrap();
                            // Long enough for a connection held across an
                            // agent restart on a loaded machine.
                            conn.set_read_timeout(Some(Duration::from_secs(15)))
                                .unwrap();
                            let mut request = Vec::new();
                            let _ = conn.read_to_end(&mut request);
                            let _ = conn.write_all(format!("{name} {}", plain(peer)).as_bytes());
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        let udp_thread = {
            let (stop, name) = (stop.clone(), name.to_string());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, peer)) = udp.recv_from_through_signals(&mut buf) {
                        let _ = udp.send_to(format!("{name} {}", plain(peer)).as_bytes(), peer);
                    }
                }
            })
        };
        Echo {
            stop,
            threads: vec![tcp_thread, udp_thread],
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A peer's address as its own family prints it.
fn plain(peer: SocketAddr) -> std::net::IpAddr {
    match peer.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// One TCP exchange from `netns` with `to`: the answer ("name source").
pub(crate) fn tcp_ask(netns: &Netns, to: SocketAddr) -> std::io::Result<String> {
    netns.run(|| {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(3)))?;
        conn.write_all(b"request")?;
        conn.shutdown(Shutdown::Write)?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    })
}

/// One UDP exchange from `netns` with `to`: the answer and where it came
/// from.
pub(crate) fn udp_ask(netns: &Netns, to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    netns.run(|| {
        let socket = if to.is_ipv4() {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
        } else {
            UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?
        };
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.send_to(b"request", to)?;
        let mut buf = [0u8; 512];
        let (len, from) = socket.recv_from_through_signals(&mut buf)?;
        Ok((String::from_utf8_lossy(&buf[..len]).into_owned(), from))
    })
}

/// Whether a connected UDP socket in `netns` learns that `to` refuses its
/// datagram (an ICMP port unreachable, reported as ECONNREFUSED).
fn udp_refused(netns: &Netns, to: SocketAddr) -> bool {
    let asked = netns.run(|| -> std::io::Result<usize> {
        let socket = if to.is_ipv4() {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
        } else {
            UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?
        };
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(to)?;
        socket.send(b"request")?;
        socket.recv_through_signals(&mut [0u8; 512])
    });
    asked.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

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

/// cp-1 and worker-1 with `--services ebpf` agents following `stub`, and
/// the outside client's address (`OUTSIDE`) on the underlay's switch.
pub(crate) fn two_nodes_and_outside(
    cgroup: &TestCgroup,
    stub: &ApiStub,
) -> (Cluster, Vec<flatnet_tests::kube_stub::ServedStub>) {
    two_nodes_and_outside_flagged(cgroup, stub, &[])
}

/// `two_nodes_and_outside` with more agent flags (`--routing vxlan`).
pub(crate) fn two_nodes_and_outside_flagged(
    cgroup: &TestCgroup,
    stub: &ApiStub,
    flags: &[&str],
) -> (Cluster, Vec<flatnet_tests::kube_stub::ServedStub>) {
    let nodes = ebpf_services_cluster_flagged(
        &specs(&[
            ("cp-1", 1, Some("10.244.0.0/24")),
            ("worker-1", 2, Some("10.244.1.0/24")),
        ]),
        cgroup,
        stub,
        flags,
    );
    nodes
        .0
        ._switch
        .exec(&["ip", "addr", "add", &format!("{OUTSIDE}/24"), "dev", "br0"]);
    nodes
}

/// A NodePort Service `name` (ClusterIP `ip`) of type NodePort on
/// `node_port`: its TCP port "http" only.
fn tcp_node_port_service(name: &str, ip: Ipv4Addr, node_port: u16) -> serde_json::Value {
    let mut service = api_service(name, ip);
    service["spec"]["type"] = "NodePort".into();
    service["spec"]["ports"][0]["nodePort"] = node_port.into();
    service
}

/// `tcp_node_port_service` with a UDP port "dns" on the same NodePort.
fn node_port_service(name: &str, ip: Ipv4Addr, node_port: u16) -> serde_json::Value {
    let mut service = tcp_node_port_service(name, ip, node_port);
    crate::socket_lb::add_udp_twin(&mut service);
    service
}

/// The EndpointSlice of a `node_port_service`: `endpoints` (address,
/// node) ready, "http" and "dns" on `BACKEND_PORT`.
fn node_port_slice(name: &str, endpoints: &[(Ipv4Addr, &str)]) -> serde_json::Value {
    let mut slice = api_slice(name, endpoints);
    slice["ports"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "dns", "port": BACKEND_PORT, "protocol": "UDP"}));
    slice
}

/// `node`'s uplink program translated outside clients' flows both ways:
/// to a local backend, to the other node's, and replies back (`context`
/// names the case in the message).
fn assert_served_in_bpf(node: &SimNode, context: &str) {
    for what in [
        action::NODEPORT_TO_POD,
        action::NODEPORT_TO_NODE,
        action::NODEPORT_REPLIED,
    ] {
        assert!(
            node.packets(what) > 0,
            "{context}: {} counted no {}",
            node.spec.name,
            action::NAMES[what as usize]
        );
    }
}

/// A dual-stack `node_port_service` `name`, its ClusterIPs 10.96.9.`n` and
/// fd96::9:`n` (the same digits).
fn dual_stack_node_port_service(name: &str, n: u8, node_port: u16) -> serde_json::Value {
    let mut service = node_port_service(name, Ipv4Addr::new(10, 96, 9, n), node_port);
    service["spec"]["clusterIPs"] =
        serde_json::json!([format!("10.96.9.{n}"), format!("fd96::9:{n}")]);
    service["spec"]["ipFamilies"] = serde_json::json!(["IPv4", "IPv6"]);
    service["spec"]["ipFamilyPolicy"] = "RequireDualStack".into();
    service
}

/// The IPv6 EndpointSlice of a dual-stack `node_port_service`: `endpoints`
/// (address, node) ready, "http" and "dns" on `backend_port`.
fn ipv6_node_port_slice(
    name: &str,
    endpoints: &[(std::net::Ipv6Addr, &str)],
    backend_port: u16,
) -> serde_json::Value {
    let mut slice = node_port_slice(name, &[]);
    slice["metadata"]["name"] = format!("{name}-v6").into();
    slice["addressType"] = "IPv6".into();
    for port in slice["ports"].as_array_mut().expect("ports") {
        port["port"] = backend_port.into();
    }
    slice["endpoints"] = endpoints
        .iter()
        .map(|(address, node)| {
            serde_json::json!({"addresses": [address.to_string()], "nodeName": node,
                               "conditions": {"ready": true}})
        })
        .collect();
    slice
}

/// `count` TCP answers from `netns` to `to`, as a set.
fn tcp_answers(netns: &Netns, to: SocketAddr, count: usize) -> BTreeSet<String> {
    (0..count)
        .map(|_| tcp_ask(netns, to).unwrap_or_else(|e| panic!("TCP to {to}: {e}")))
        .collect()
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
    wait_until("cp-1's agent to count the translated flows", SETTLE, || {
        let page = cp.metrics();
        kube_stub::metric(&page, "flatnet_nat_flows").is_some_and(|n| n >= flows.len() as f64)
            && kube_stub::metric(&page, "flatnet_nat_flows_max")
                == Some(f64::from(flatnet_common::MAX_NAT_FLOWS))
            && kube_stub::metric(&page, "flatnet_nat_expired_total") == Some(0.0)
    });

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

/// What an outside client gets from a NodePort (externalTrafficPolicy
/// Cluster, TCP and UDP, a backend on each node) through each node: the
/// backends that answer, who each says the client was, where UDP answers
/// come from, and whether a port that is no NodePort's is refused.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// (node, protocol) -> the answers ("name source"), the sources
    /// written as what they are ("node", "gateway", "client" or the
    /// address).
    answers: std::collections::BTreeMap<(String, &'static str), BTreeSet<String>>,
    udp_answers_from_the_node_port: bool,
    other_port_refused: bool,
    /// (node, protocol) -> whether every try of the Service whose
    /// backends listen on nothing was refused (TCP: the backend's reset;
    /// UDP: its ICMP port unreachable, translated back).
    closed_backends_refuse: std::collections::BTreeMap<(String, &'static str), bool>,
    /// Port unreachables the backends got for answers that came after
    /// their client's socket had closed (the client's kernel's error,
    /// translated back to the backend), of `LATE_TRIES` per node.
    late_answers_refused_at_the_backends: u64,
    /// node -> whether datagrams too large for one packet (fragmented by
    /// the client's kernel, and the echo by the backend's) were echoed
    /// whole, from the NodePort.
    large_datagrams_echoed: std::collections::BTreeMap<String, bool>,
    /// IPv6: node -> the path MTU the client learned toward its NodePort
    /// from a translated packet too big (none over IPv4).
    learned_path_mtu: std::collections::BTreeMap<String, Option<u32>>,
}

/// A datagram three fragments long on the underlay's 1,500 bytes.
const LARGE_DATAGRAM: usize = 3000;

/// Whether `to` echoes a `LARGE_DATAGRAM`-byte datagram from `netns` whole,
/// from `to`.
fn large_datagram_echoed(netns: &Netns, to: SocketAddr) -> bool {
    netns
        .run(|| -> std::io::Result<bool> {
            let socket = if to.is_ipv4() {
                UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
            } else {
                UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?
            };
            socket.set_read_timeout(Some(LATE_BY * 4))?;
            let datagram: Vec<u8> = (0..LARGE_DATAGRAM).map(|i| (i % 251) as u8).collect();
            socket.send_to(&datagram, to)?;
            let mut buf = vec![0u8; LARGE_DATAGRAM * 2];
            let (len, from) = socket.recv_from_through_signals(&mut buf)?;
            Ok(from == to && buf[..len] == datagram[..])
        })
        .unwrap_or(false)
}

/// cp-1 and worker-1, dual-stack, and `stub`'s Node objects saying so
/// (an IPv6 InternalIP, both pod CIDRs).
fn dual_stack_nodes(stub: &ApiStub) -> Vec<NodeSpec> {
    let mut specs = flatnet_tests::cluster::specs(&[
        ("cp-1", 1, Some("10.244.0.0/24")),
        ("worker-1", 2, Some("10.244.1.0/24")),
    ]);
    for spec in &mut specs {
        spec.dual_stack = true;
        let (address6, cidr6) = (spec.address6().to_string(), spec.pod_cidr6());
        let cidr4 = spec.pod_cidr.clone().unwrap();
        stub.modify(Kind::Node, &spec.name, |node| {
            node["status"]["addresses"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"type": "InternalIP", "address": address6}));
            node["spec"]["podCIDR"] = cidr4.clone().into();
            node["spec"]["podCIDRs"] = serde_json::json!([cidr4, cidr6]);
        });
    }
    specs
}

/// The outside client's IPv6 address on the switch.
fn add_outside6(outside: &Netns) {
    outside.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{OUTSIDE6}/64"),
        "dev",
        "br0",
        "nodad",
    ]);
}

/// Large datagrams from `netns` to `to` until a backend behind a smaller
/// MTU is asked (16 tries at most), whose packet too big teaches the
/// client the path's MTU (IPv6 routers do not fragment); the MTU learned.
fn learn_path_mtu(netns: &Netns, to: SocketAddr) -> Option<u32> {
    for _ in 0..16 {
        large_datagram_echoed(netns, to);
        if let Some(mtu) = path_mtu(netns, to).filter(|mtu| *mtu < 1500) {
            return Some(mtu);
        }
    }
    path_mtu(netns, to)
}

/// Datagrams per node whose client leaves before the late answer.
const LATE_TRIES: u64 = 4;

fn outcome(cluster: &Cluster, backends: [&Netns; 2], family: Family) -> Outcome {
    let outside = &cluster._switch;
    let mut answers = std::collections::BTreeMap::new();
    let mut udp_from_node_port = true;
    let mut refused = true;
    let mut closed_refuse = std::collections::BTreeMap::new();
    for node in [cluster.node("cp-1"), cluster.node("worker-1")] {
        let to = SocketAddr::new(family.node(node), NODE_PORT);
        let name_source = |answer: String| {
            let (name, source) = answer.split_once(' ').expect("name source");
            let source: std::net::IpAddr = source.parse().expect("source");
            let what = if source == family.node(node) {
                "node".to_string()
            } else if source == family.outside() {
                "client".to_string()
            } else if source.to_string().ends_with(".1") || source.to_string().ends_with("::1") {
                "gateway".to_string()
            } else {
                source.to_string()
            };
            format!("{name} {what}")
        };
        let tcp = (0..16)
            .map(|_| name_source(tcp_ask(outside, to).unwrap_or_else(|e| panic!("TCP {to}: {e}"))))
            .collect();
        let udp = (0..16)
            .map(|_| {
                let (answer, from) =
                    udp_ask(outside, to).unwrap_or_else(|e| panic!("UDP {to}: {e}"));
                udp_from_node_port &= from == to;
                name_source(answer)
            })
            .collect();
        answers.insert((node.spec.name.clone(), "tcp"), tcp);
        answers.insert((node.spec.name.clone(), "udp"), udp);
        let other = SocketAddr::new(family.node(node), NODE_PORT + 1);
        refused &= tcp_ask(outside, other)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        let closed = SocketAddr::new(family.node(node), CLOSED_NODE_PORT);
        // Eight tries each: both backends are asked.
        closed_refuse.insert(
            (node.spec.name.clone(), "tcp"),
            (0..8).all(|_| {
                tcp_ask(outside, closed)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            }),
        );
        closed_refuse.insert(
            (node.spec.name.clone(), "udp"),
            (0..8).all(|_| udp_refused(outside, closed)),
        );
    }
    let unreachables = || -> u64 {
        backends
            .iter()
            .map(|b| dest_unreachables_received(b, family))
            .sum()
    };
    let before = unreachables();
    for node in [cluster.node("cp-1"), cluster.node("worker-1")] {
        let late = SocketAddr::new(family.node(node), LATE_NODE_PORT);
        for _ in 0..LATE_TRIES {
            // Sent, and the socket closed at once.
            outside.run(|| {
                UdpSocket::bind((family.unspecified(), 0))
                    .and_then(|socket| socket.send_to(b"late", late))
                    .expect("UDP to the late NodePort")
            });
            std::thread::sleep(LATE_BY * 2);
        }
    }
    let late_refused = unreachables() - before;
    let mut learned_path_mtu = std::collections::BTreeMap::new();
    let large = [cluster.node("cp-1"), cluster.node("worker-1")]
        .iter()
        .map(|node| {
            let to = SocketAddr::new(family.node(node), LATE_NODE_PORT);
            if family == Family::V6 {
                learned_path_mtu.insert(node.spec.name.clone(), learn_path_mtu(outside, to));
            }
            // Four tries: both backends are asked.
            let echoed = (0..4).all(|_| large_datagram_echoed(outside, to));
            (node.spec.name.clone(), echoed)
        })
        .collect();
    Outcome {
        answers,
        udp_answers_from_the_node_port: udp_from_node_port,
        other_port_refused: refused,
        closed_backends_refuse: closed_refuse,
        late_answers_refused_at_the_backends: late_refused,
        large_datagrams_echoed: large,
        learned_path_mtu,
    }
}

/// The side-by-side tests' servers in both clusters' backend pods (a
/// late UDP answerer and the echo servers), with `family`'s ICMP rate
/// limit off in the pods and the client: a kernel sends a peer at most
/// six errors at once and one per second after, and the closed and late
/// Services' checks make many.
fn serve_side_by_side(
    clusters: [&Cluster; 2],
    pods: &[(SimPod, SimPod)],
    family: Family,
) -> (Vec<LateUdp>, Vec<Echo>) {
    let rate_limit_off = match family {
        Family::V4 => "net.ipv4.icmp_ratelimit=0",
        Family::V6 => "net.ipv6.icmp.ratelimit=0",
    };
    for (local, remote) in pods {
        for pod in [local, remote] {
            pod.netns.exec(&["sysctl", "-qw", rate_limit_off]);
        }
    }
    for cluster in clusters {
        cluster._switch.exec(&["sysctl", "-qw", rate_limit_off]);
    }
    let late = pods
        .iter()
        .flat_map(|(local, remote)| [LateUdp::start(&local.netns), LateUdp::start(&remote.netns)])
        .collect();
    let echoes = pods
        .iter()
        .flat_map(|(local, remote)| {
            [
                Echo::start(&local.netns, "on-cp-1"),
                Echo::start(&remote.netns, "on-worker-1"),
            ]
        })
        .collect();
    (late, echoes)
}

/// Waits until flatnet's agents on both nodes serve each NodePort
/// `(port, protocol)` on `wildcard`'s family with both backends.
fn wait_for_node_ports(flatnet: &Cluster, wildcard: std::net::IpAddr, ports: &[(u16, u8)]) {
    wait_until("flatnet's agents to serve the NodePorts", SETTLE, || {
        ["cp-1", "worker-1"].iter().all(|name| {
            ports.iter().all(|&(port, protocol)| {
                flatnet
                    .node(name)
                    .datapath()
                    .service_backends(&service_key(wildcard, port, protocol))
                    .ok()
                    .flatten()
                    .is_some_and(|set| set.len() == 2)
            })
        })
    });
}

/// The outcome through flatnet's cluster and through kube-proxy's (each
/// with its two backends' namespaces) over `family`, asserted the same and
/// that of working NodePorts: UDP answers from the NodePort, another port
/// refused, closed backends refusing, every late answer's port unreachable
/// back at its backend, large datagrams echoed whole.
fn compare_outcomes(
    [flatnet, kube_proxy]: [&Cluster; 2],
    [flatnet_backends, kube_proxy_backends]: [[&Netns; 2]; 2],
    family: Family,
) -> Outcome {
    let through_flatnet = outcome(flatnet, flatnet_backends, family);
    let through_kube_proxy = outcome(kube_proxy, kube_proxy_backends, family);
    assert_eq!(through_flatnet, through_kube_proxy);
    let same = through_flatnet;
    assert!(
        same.udp_answers_from_the_node_port && same.other_port_refused,
        "{same:?}"
    );
    assert!(
        same.closed_backends_refuse.values().all(|&refused| refused),
        "{same:?}"
    );
    assert_eq!(
        same.late_answers_refused_at_the_backends,
        2 * LATE_TRIES,
        "{same:?}"
    );
    assert!(
        same.large_datagrams_echoed.values().all(|&echoed| echoed),
        "{same:?}"
    );
    same
}

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
    wait_until("cp-1's agent to serve the NodePort", SETTLE, frontend_there);
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

//! Kubernetes Services next to flatnet's fast path: kube-proxy's own rule
//! shapes (iptables and nftables modes, `flatnet_tests::kube_proxy`) on the
//! simulated cluster's nodes (`flatnet_tests::cluster`), with real agents,
//! real pods and real traffic, over IPv4 and IPv6. Every case that the host
//! translates (ClusterIP, NodePort, hostPort, hairpin) must work as on the
//! reference bridge, and pod-to-pod traffic must keep the fast path.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_proxy::{Mode, Protocol, ServicePort};
use flatnet_tests::*;

/// Where backends listen (a Service's targetPort).
const BACKEND_PORT: u16 = 8080;
const DNS_PORT: u16 = 53;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Both families, as each case runs in each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// ClusterIP number `n` of a family.
fn cluster_ip(family: Family, n: u16) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::new(10, 96, (n >> 8) as u8, n as u8)),
        Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, 0, n)),
    }
}

fn pod_ip(pod: &SimPod, family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(pod.ip),
        Family::V6 => IpAddr::V6(pod.ip6.expect("a dual-stack pod")),
    }
}

fn node_ip(node: &SimNode, family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(node.spec.address()),
        Family::V6 => IpAddr::V6(node.spec.address6()),
    }
}

/// A dual-stack cluster of `nodes` nodes with agents, and kube-proxy in
/// `mode` on every node.
struct ServiceCluster {
    cluster: Cluster,
    mode: Mode,
}

impl ServiceCluster {
    fn new(mode: Mode, nodes: u8) -> Self {
        Self::flagged(mode, nodes, &[])
    }

    /// As `new`, each agent also given `flags` (`--datapath xdp`).
    fn flagged(mode: Mode, nodes: u8, flags: &[&str]) -> Self {
        ServiceCluster {
            cluster: Cluster::started(&Cluster::numbered(nodes, true), flags),
            mode,
        }
    }

    fn node(&self, name: &str) -> &SimNode {
        self.cluster.node(name)
    }

    /// What every node's kube-proxy programs for `services` (all nodes see
    /// all Services, as kube-proxy does).
    fn program(&self, services: &[ServicePort]) {
        self.cluster.program_kube_proxy(self.mode, services);
    }
}

/// A backend's TCP server in a pod: answers every connection with its name
/// and a newline, then echoes. Runs until dropped.
struct TcpBackend {
    stop: Arc<AtomicBool>,
    port: u16,
    netns_path: std::path::PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpBackend {
    fn start(pod: &SimPod, name: &str, port: u16) -> Self {
        // One dual-stack socket serves both families.
        let listener = pod
            .netns
            .run(|| TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)))
            .expect("backend listen");
        let stop = Arc::new(AtomicBool::new(false));
        let name = name.to_string();
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(mut conn) = conn else { continue };
                    let name = name.clone();
                    std::thread::spawn(move || {
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
                        let _ = conn.write_all(format!("{name}\n").as_bytes());
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = conn.read(&mut buf) {
                            if n == 0 || conn.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            })
        };
        TcpBackend {
            stop,
            port,
            netns_path: pod.netns.path(),
            thread: Some(thread),
        }
    }
}

impl Drop for TcpBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop with one last connection from inside.
        let port = self.port;
        let path = self.netns_path.clone();
        let _ = std::thread::spawn(move || {
            enter_thread(&path).ok()?;
            TcpStream::connect_timeout(&(Ipv6Addr::LOCALHOST, port).into(), IO_TIMEOUT).ok()
        })
        .join();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One TCP exchange from `client` to `to`: the backend's name, and `len`
/// bytes echoed intact.
fn tcp_request(client: &SimPod, to: SocketAddr, len: usize) -> anyhow::Result<String> {
    client.netns.run(|| {
        let mut conn = TcpStream::connect_timeout(&to, IO_TIMEOUT)?;
        conn.set_read_timeout(Some(IO_TIMEOUT))?;
        conn.set_write_timeout(Some(IO_TIMEOUT))?;
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        // The backend echoes while it reads: written from one thread and
        // read from another, or both ends block writing into full buffers
        // (seen: a 4 MiB request stuck after 1.2 MB, both sides rwnd-limited).
        let mut writer = conn.try_clone()?;
        let mut answer = Vec::new();
        std::thread::scope(|scope| -> std::io::Result<()> {
            let sent = scope.spawn(|| -> std::io::Result<()> {
                writer.write_all(&payload)?;
                writer.shutdown(std::net::Shutdown::Write)
            });
            let read = conn.read_to_end(&mut answer);
            sent.join()
                .map_err(|_| std::io::Error::other("the writer thread panicked"))??;
            read.map(|_| ())
        })?;
        let newline = answer
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| anyhow::anyhow!("no banner from {to}"))?;
        anyhow::ensure!(
            answer[newline + 1..] == payload[..],
            "echo from {to} differs: {} of {len} bytes",
            answer.len() - newline - 1
        );
        Ok(String::from_utf8_lossy(&answer[..newline]).into_owned())
    })
}

/// A backend's UDP server in a pod: answers each datagram with
/// "<name> <datagram>" from the address it was sent to.
struct UdpBackend {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpBackend {
    fn start(pod: &SimPod, name: &str, port: u16) -> Self {
        let socket = pod
            .netns
            .run(|| UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port)))
            .expect("backend bind");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let name = name.to_string();
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    let mut answer = format!("{name} ").into_bytes();
                    answer.extend_from_slice(&buf[..n]);
                    let _ = socket.send_to(&answer, from);
                }
            })
        };
        UdpBackend {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One UDP query from `client` to `to`: the answer must come from `to`
/// itself (a resolver drops anything else) and quote the query. Returns
/// the answering backend's name.
fn udp_query(client: &SimPod, to: SocketAddr, query: &str) -> anyhow::Result<String> {
    client.netns.run(|| {
        let bind: SocketAddr = if to.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind)?;
        socket.set_read_timeout(Some(Duration::from_millis(500)))?;
        // A lost datagram is retried, as resolvers do; a wrong source is not
        // accepted, however often.
        for _ in 0..6 {
            socket.send_to(query.as_bytes(), to)?;
            let mut buf = [0u8; 2048];
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            anyhow::ensure!(from == to, "answer from {from}, not {to}");
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let (name, echoed) = text
                .split_once(' ')
                .ok_or_else(|| anyhow::anyhow!("malformed answer {text:?}"))?;
            anyhow::ensure!(echoed == query, "answer {text:?} to query {query:?}");
            return Ok(name.to_string());
        }
        anyhow::bail!("no answer from {to}")
    })
}

fn translated(node: &SimNode) -> u64 {
    node.packets(action::TRANSLATED)
}

// ---------------------------------------------------------------------------

fn clusterip_to_a_backend_on_the_same_node(mode: Mode, flags: &[&str]) {
    let services = ServiceCluster::flagged(mode, 2, flags);
    let n1 = services.node("n1");
    let (client, backend) = (n1.pod(), n1.pod());
    let _tcp = TcpBackend::start(&backend, "b", BACKEND_PORT);
    let _udp = UdpBackend::start(&backend, "b", DNS_PORT);
    let mut list = Vec::new();
    for family in FAMILIES {
        let b = pod_ip(&backend, family);
        list.push(ServicePort::cluster_ip(
            &format!("web-{family:?}").to_lowercase(),
            cluster_ip(family, 10),
            80,
            Protocol::Tcp,
            vec![SocketAddr::new(b, BACKEND_PORT)],
        ));
        list.push(ServicePort::cluster_ip(
            &format!("dns-{family:?}").to_lowercase(),
            cluster_ip(family, 53),
            DNS_PORT,
            Protocol::Udp,
            vec![SocketAddr::new(b, DNS_PORT)],
        ));
    }
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

#[flatnet_test(root)]
fn clusterip_to_a_backend_on_the_same_node_iptables() {
    clusterip_to_a_backend_on_the_same_node(Mode::Iptables, &[]);
}

#[flatnet_test(root)]
fn clusterip_to_a_backend_on_the_same_node_nftables() {
    clusterip_to_a_backend_on_the_same_node(Mode::Nftables, &[]);
}

#[flatnet_test(root)]
fn clusterip_to_a_backend_on_the_same_node_xdp_iptables() {
    clusterip_to_a_backend_on_the_same_node(Mode::Iptables, &["--datapath", "xdp"]);
}

#[flatnet_test(root)]
fn clusterip_to_a_backend_on_the_same_node_xdp_nftables() {
    clusterip_to_a_backend_on_the_same_node(Mode::Nftables, &["--datapath", "xdp"]);
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
            if let Err(e) = socket.recv(&mut buf)
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

#[flatnet_test(root)]
fn icmp_errors_reach_the_client_iptables() {
    icmp_errors_reach_the_client(Mode::Iptables);
}

#[flatnet_test(root)]
fn icmp_errors_reach_the_client_nftables() {
    icmp_errors_reach_the_client(Mode::Nftables);
}

/// Three backends, two on the client's node and one on the other: every
/// connection completes, whichever backend kube-proxy picks, and each
/// backend gets some (replies from the remote one come back through the
/// client node's uplink program, which must hand them to the stack).
fn clusterip_spreads_over_local_and_remote_backends(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let client = n1.pod();
    let backends = [n1.pod(), n1.pod(), n2.pod()];
    let names = ["local1", "local2", "remote"];
    let _servers: Vec<TcpBackend> = backends
        .iter()
        .zip(names)
        .map(|(pod, name)| TcpBackend::start(pod, name, BACKEND_PORT))
        .collect();
    let list: Vec<ServicePort> = FAMILIES
        .iter()
        .map(|family| {
            ServicePort::cluster_ip(
                &format!("web-{family:?}").to_lowercase(),
                cluster_ip(*family, 10),
                80,
                Protocol::Tcp,
                backends
                    .iter()
                    .map(|pod| SocketAddr::new(pod_ip(pod, *family), BACKEND_PORT))
                    .collect(),
            )
        })
        .collect();
    services.program(&list);
    for family in FAMILIES {
        let before = (
            n1.packets(action::TRANSLATED),
            n2.packets(action::TO_REMOTE_NODE),
        );
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
        // The remote backend's replies took n2's fast path out.
        assert!(n2.packets(action::TO_REMOTE_NODE) > before.1);
    }
}

#[flatnet_test(root)]
fn clusterip_spreads_over_local_and_remote_backends_iptables() {
    clusterip_spreads_over_local_and_remote_backends(Mode::Iptables);
}

#[flatnet_test(root)]
fn clusterip_spreads_over_local_and_remote_backends_nftables() {
    clusterip_spreads_over_local_and_remote_backends(Mode::Nftables);
}

/// A pod reaching itself through its own Service (kube-proxy masquerades
/// it), over TCP and UDP.
fn hairpin(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let n1 = services.node("n1");
    let pod = n1.pod();
    let _tcp = TcpBackend::start(&pod, "self", BACKEND_PORT);
    let _udp = UdpBackend::start(&pod, "self", DNS_PORT);
    let mut list = Vec::new();
    for family in FAMILIES {
        let me = pod_ip(&pod, family);
        list.push(ServicePort::cluster_ip(
            &format!("web-{family:?}").to_lowercase(),
            cluster_ip(family, 10),
            80,
            Protocol::Tcp,
            vec![SocketAddr::new(me, BACKEND_PORT)],
        ));
        list.push(ServicePort::cluster_ip(
            &format!("dns-{family:?}").to_lowercase(),
            cluster_ip(family, 53),
            DNS_PORT,
            Protocol::Udp,
            vec![SocketAddr::new(me, DNS_PORT)],
        ));
    }
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

#[flatnet_test(root)]
fn hairpin_iptables() {
    hairpin(Mode::Iptables);
}

#[flatnet_test(root)]
fn hairpin_nftables() {
    hairpin(Mode::Nftables);
}

const NODE_PORT: u16 = 30080;

/// A NodePort Service whose backend is on n1, reached from a pod on n1
/// (n1's address), and from a pod on n2 (n1's address, and n2's own,
/// which sends it on to n1).
fn nodeport(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let backend = n1.pod();
    let (near, far) = (n1.pod(), n2.pod());
    let _tcp = TcpBackend::start(&backend, "b", BACKEND_PORT);
    let list: Vec<ServicePort> = FAMILIES
        .iter()
        .map(|family| {
            ServicePort::cluster_ip(
                &format!("web-{family:?}").to_lowercase(),
                cluster_ip(*family, 10),
                80,
                Protocol::Tcp,
                vec![SocketAddr::new(pod_ip(&backend, *family), BACKEND_PORT)],
            )
            .with_node_port(NODE_PORT)
        })
        .collect();
    services.program(&list);
    for family in FAMILIES {
        for (client, node, what) in [
            (&near, n1, "same node"),
            (&far, n1, "another node, to the backend's node"),
            (&far, n2, "another node, to its own node"),
        ] {
            let to = SocketAddr::new(node_ip(node, family), NODE_PORT);
            let name = tcp_request(client, to, 64 << 10)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} NodePort from {what} ({to}): {e}"));
            assert_eq!(name, "b");
        }
    }
}

#[flatnet_test(root)]
fn nodeport_iptables() {
    nodeport(Mode::Iptables);
}

#[flatnet_test(root)]
fn nodeport_nftables() {
    nodeport(Mode::Nftables);
}

const HOST_PORT: u16 = 8081;

/// The reference portmap plugin chained after flatnet for one pod (what a
/// Pod's hostPort asks for); DEL on drop.
struct PortMapping<'a> {
    pod: &'a SimPod<'a>,
    conf: serde_json::Value,
}

impl<'a> PortMapping<'a> {
    fn add(pod: &'a SimPod<'a>, host_port: u16, container_port: u16) -> Self {
        let mappings: Vec<serde_json::Value> = ["0.0.0.0", "::"]
            .iter()
            .map(|host_ip| {
                serde_json::json!({"hostPort": host_port, "containerPort": container_port,
                    "protocol": "tcp", "hostIP": host_ip})
            })
            .collect();
        // Debian's portmap (1.1.1) speaks CNI 1.0.0 at most: the list runs
        // at 1.0.0, and flatnet's 1.1.0 result reads the same there.
        let mut prev_result = pod.result.clone();
        prev_result["cniVersion"] = serde_json::json!("1.0.0");
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": pod.node.network,
            "type": "portmap",
            "snat": true,
            "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": mappings},
            "prevResult": prev_result,
        });
        let mapping = PortMapping { pod, conf };
        let out = mapping.run("ADD");
        assert!(out.success(), "portmap ADD: {out:?}");
        mapping
    }

    fn run(&self, command: &str) -> CniOutput {
        let mut call = CniCall::new(command, &self.pod.container, &self.pod.netns.path(), "eth0");
        call.node = Some(self.pod.node.netns.path());
        call.run(
            &find_plugin("portmap", &call.path),
            self.conf.to_string().as_bytes(),
        )
    }
}

impl Drop for PortMapping<'_> {
    fn drop(&mut self) {
        let out = self.run("DEL");
        if !out.success() {
            eprintln!("portmap DEL failed: {out:?}");
        }
    }
}

/// A hostPort (portmap chained, snat on) on n1, reached from a pod on n1
/// and from a pod on n2, next to kube-proxy's rules.
fn hostport(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let backend = n1.pod();
    let (near, far) = (n1.pod(), n2.pod());
    let _tcp = TcpBackend::start(&backend, "b", BACKEND_PORT);
    let _mapping = PortMapping::add(&backend, HOST_PORT, BACKEND_PORT);
    let list: Vec<ServicePort> = FAMILIES
        .iter()
        .map(|family| {
            ServicePort::cluster_ip(
                &format!("web-{family:?}").to_lowercase(),
                cluster_ip(*family, 10),
                80,
                Protocol::Tcp,
                vec![SocketAddr::new(pod_ip(&backend, *family), BACKEND_PORT)],
            )
        })
        .collect();
    services.program(&list);
    for family in FAMILIES {
        let before = n1.packets(action::TRANSLATED);
        for (client, what) in [(&near, "same node"), (&far, "another node")] {
            let to = SocketAddr::new(node_ip(n1, family), HOST_PORT);
            let name = tcp_request(client, to, 64 << 10)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} hostPort from {what} ({to}): {e}"));
            assert_eq!(name, "b");
        }
        // Both replies met a DNAT the fast path had to leave to the stack
        // (one for a local pod, one for a pod on another node).
        assert!(n1.packets(action::TRANSLATED) > before);
    }
}

#[flatnet_test(root)]
fn hostport_iptables() {
    hostport(Mode::Iptables);
}

#[flatnet_test(root)]
fn hostport_nftables() {
    hostport(Mode::Nftables);
}

/// Streams paced data to `to` for `duration` while reading the echo back
/// (data both ways on one connection); runs `during` in the middle. Returns
/// (bytes sent, bytes echoed back). A reset or a stall fails.
fn echo_stream_during(
    client: &SimPod,
    to: SocketAddr,
    duration: Duration,
    during: impl FnOnce(),
) -> (u64, u64) {
    let conn = client
        .netns
        .run(|| TcpStream::connect_timeout(&to, IO_TIMEOUT))
        .unwrap_or_else(|e| panic!("connect {to}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = conn.try_clone().unwrap();
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        let mut banner_done = false;
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => {
                    let mut data = &buf[..n];
                    if !banner_done {
                        match data.iter().position(|b| *b == b'\n') {
                            Some(at) => {
                                banner_done = true;
                                data = &data[at + 1..];
                            }
                            None => continue,
                        }
                    }
                    total += data.len() as u64;
                }
                Err(e) => panic!("receiving the echo: {e} after {total} bytes"),
            }
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        let mut writer = conn.try_clone().unwrap();
        std::thread::spawn(move || {
            writer
                .set_write_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let chunk = vec![3u8; 8 * 1024];
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = writer.write_all(&chunk) {
                    panic!("sending: {e} after {sent} bytes");
                }
                sent += chunk.len() as u64;
                // Paced: a stream that lasts the whole window.
                std::thread::sleep(Duration::from_millis(1));
            }
            writer.shutdown(std::net::Shutdown::Write).unwrap();
            sent
        })
    };
    let started = Instant::now();
    // The change lands a third into the stream, which then runs its course:
    // fixed windows are what the test is about.
    std::thread::sleep(duration / 3);
    during();
    if let Some(left) = duration.checked_sub(started.elapsed()) {
        std::thread::sleep(left);
    }
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender");
    let echoed = receiver.join().expect("receiver");
    (sent, echoed)
}

/// IDs of the node's pinned from_pod and from_uplink.
fn program_ids(node: &SimNode) -> Vec<u32> {
    let datapath = node.datapath();
    [
        flatnet_common::PROG_FROM_POD,
        flatnet_common::PROG_FROM_UPLINK,
    ]
    .iter()
    .map(|name| {
        datapath
            .program(name)
            .and_then(|p| p.id())
            .expect("pinned program")
    })
    .collect()
}

/// Two TCP streams through ClusterIPs, one to a backend on the client's
/// node (every reply a translated flow `from_pod` must hand to the stack),
/// one to a backend on the other node (replies `from_uplink` must hand to
/// the stack), while the client's node's datapath is upgraded (the pinned
/// programs are made to look like an older build's, and the next ADD loads
/// this build's and moves every veth over, as a plugin upgrade does) and
/// both nodes' agents restart. No reset, no byte lost either way.
fn streams_through_clusterips_survive_an_upgrade(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let (client, near, far) = (n1.pod(), n1.pod(), n2.pod());
    let _servers = [
        TcpBackend::start(&near, "near", BACKEND_PORT),
        TcpBackend::start(&far, "far", BACKEND_PORT),
    ];
    let mut list = Vec::new();
    for family in FAMILIES {
        for (n, backend) in [(10, &near), (11, &far)] {
            list.push(ServicePort::cluster_ip(
                &format!("web{n}-{family:?}").to_lowercase(),
                cluster_ip(family, n),
                80,
                Protocol::Tcp,
                vec![SocketAddr::new(pod_ip(backend, family), BACKEND_PORT)],
            ));
        }
    }
    services.program(&list);
    let peers = services.cluster.file();
    for family in FAMILIES {
        let before = program_ids(n1);
        let datapath = n1.datapath();
        let mut third = None;
        let ((sent, echoed), (sent_far, echoed_far)) = std::thread::scope(|scope| {
            let far_stream = scope.spawn(|| {
                echo_stream_during(
                    &client,
                    SocketAddr::new(cluster_ip(family, 11), 80),
                    Duration::from_secs(10),
                    || {},
                )
            });
            let near_stream = echo_stream_during(
                &client,
                SocketAddr::new(cluster_ip(family, 10), 80),
                Duration::from_secs(10),
                || {
                    for name in [
                        flatnet_common::PROG_FROM_POD,
                        flatnet_common::PROG_FROM_UPLINK,
                    ] {
                        let pinned = datapath.program_path(name);
                        let older = pinned.with_file_name(format!("{name}-000000000000"));
                        std::fs::rename(&pinned, &older).expect("age the pinned program");
                    }
                    third = Some(n1.pod());
                    for node in [n1, n2] {
                        node.stop_agent();
                        node.start_agent(&peers);
                        node.wait_ready();
                    }
                },
            );
            (near_stream, far_stream.join().expect("far stream"))
        });
        for (what, sent, echoed) in [("near", sent, echoed), ("far", sent_far, echoed_far)] {
            assert_eq!(sent, echoed, "{mode:?} {family:?} {what}: bytes lost");
            assert!(
                sent > 1 << 20,
                "{mode:?} {family:?} {what}: the stream barely moved: {sent} bytes"
            );
        }
        let after = program_ids(n1);
        assert!(
            after.iter().zip(&before).all(|(a, b)| a != b),
            "{mode:?} {family:?}: no new programs were loaded ({before:?} -> {after:?})"
        );
        drop(third);
    }
}

#[flatnet_test(root)]
fn streams_through_clusterips_survive_an_upgrade_iptables() {
    streams_through_clusterips_survive_an_upgrade(Mode::Iptables);
}

#[flatnet_test(root)]
fn streams_through_clusterips_survive_an_upgrade_nftables() {
    streams_through_clusterips_survive_an_upgrade(Mode::Nftables);
}

const DNS_CLIENTS: usize = 20;

/// A DNS-like server pod behind ClusterIP:53 and 20 client pods (half on
/// its node, half on the other) querying at once: each gets the answer to
/// its own query, from the ClusterIP.
fn dns_like_clients_at_once(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let server = n1.pod();
    let _udp = UdpBackend::start(&server, "dns", DNS_PORT);
    let clients: Vec<SimPod> = (0..DNS_CLIENTS)
        .map(|i| if i % 2 == 0 { n1.pod() } else { n2.pod() })
        .collect();
    let list: Vec<ServicePort> = FAMILIES
        .iter()
        .map(|family| {
            ServicePort::cluster_ip(
                &format!("dns-{family:?}").to_lowercase(),
                cluster_ip(*family, 53),
                DNS_PORT,
                Protocol::Udp,
                vec![SocketAddr::new(pod_ip(&server, *family), DNS_PORT)],
            )
        })
        .collect();
    services.program(&list);
    for family in FAMILIES {
        let to = SocketAddr::new(cluster_ip(family, 53), DNS_PORT);
        let barrier = std::sync::Barrier::new(DNS_CLIENTS);
        let answers: Vec<anyhow::Result<String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = clients
                .iter()
                .enumerate()
                .map(|(i, client)| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        udp_query(client, to, &format!("query-{i}.{family:?}.example"))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("client"))
                .collect()
        });
        for (i, answer) in answers.into_iter().enumerate() {
            let name = answer.unwrap_or_else(|e| panic!("{mode:?} {family:?} client {i}: {e}"));
            assert_eq!(name, "dns");
        }
    }
}

#[flatnet_test(root)]
fn dns_like_clients_at_once_iptables() {
    dns_like_clients_at_once(Mode::Iptables);
}

#[flatnet_test(root)]
fn dns_like_clients_at_once_nftables() {
    dns_like_clients_at_once(Mode::Nftables);
}

/// With Services in place and in use, direct pod-to-pod traffic still
/// takes the redirect (same node) and the fast path out (other node), and
/// the node's stack forwards next to nothing of it.
fn pod_to_pod_keeps_the_fast_path_next_to_services(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let (a, b, c) = (n1.pod(), n1.pod(), n2.pod());
    let _servers: Vec<TcpBackend> = [(&b, "b"), (&c, "c")]
        .into_iter()
        .map(|(pod, name)| TcpBackend::start(pod, name, BACKEND_PORT))
        .collect();
    let list: Vec<ServicePort> = FAMILIES
        .iter()
        .map(|family| {
            ServicePort::cluster_ip(
                &format!("web-{family:?}").to_lowercase(),
                cluster_ip(*family, 10),
                80,
                Protocol::Tcp,
                [&b, &c]
                    .iter()
                    .map(|pod| SocketAddr::new(pod_ip(pod, *family), BACKEND_PORT))
                    .collect(),
            )
            .with_node_port(NODE_PORT)
        })
        .collect();
    services.program(&list);
    for family in FAMILIES {
        // The Services in use first: conntrack holds their flows.
        for _ in 0..10 {
            tcp_request(&a, SocketAddr::new(cluster_ip(family, 10), 80), 1024)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} ClusterIP: {e}"));
        }
        const LEN: usize = 4 << 20;
        let redirected = n1.bytes(action::REDIRECTED);
        let forwarded = n1.forwarded();
        let name = tcp_request(&a, SocketAddr::new(pod_ip(&b, family), BACKEND_PORT), LEN)
            .unwrap_or_else(|e| panic!("{mode:?} {family:?} a -> b: {e}"));
        assert_eq!(name, "b");
        let redirected = n1.bytes(action::REDIRECTED) - redirected;
        // 4 MiB each way, redirected by n1 both ways.
        assert!(
            redirected > 2 * LEN as u64,
            "{mode:?} {family:?}: only {redirected} bytes redirected"
        );
        let out = n1.bytes(action::TO_REMOTE_NODE);
        let name = tcp_request(&a, SocketAddr::new(pod_ip(&c, family), BACKEND_PORT), LEN)
            .unwrap_or_else(|e| panic!("{mode:?} {family:?} a -> c: {e}"));
        assert_eq!(name, "c");
        let out = n1.bytes(action::TO_REMOTE_NODE) - out;
        assert!(
            out > LEN as u64 * 49 / 50,
            "{mode:?} {family:?}: only {out} bytes to n2"
        );
        if family == Family::V4 {
            // ForwDatagrams is IPv4's counter: segments of 8 MiB each way
            // and their ACKs, of which the stack routed (nearly) none.
            let forwarded = n1.forwarded() - forwarded;
            assert!(
                forwarded < 50,
                "{mode:?}: n1's stack forwarded {forwarded} datagrams"
            );
        }
    }
}

#[flatnet_test(root)]
fn pod_to_pod_keeps_the_fast_path_next_to_services_iptables() {
    pod_to_pod_keeps_the_fast_path_next_to_services(Mode::Iptables);
}

#[flatnet_test(root)]
fn pod_to_pod_keeps_the_fast_path_next_to_services_nftables() {
    pod_to_pod_keeps_the_fast_path_next_to_services(Mode::Nftables);
}

/// Connects from `source` (an address the calling thread's namespace has)
/// to `to`; Err when nothing answers within `timeout`.
fn tcp_connect_from(source: SocketAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    let domain = socket2::Domain::for_address(to);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    socket.bind(&source.into())?;
    socket.connect_timeout(&to.into(), timeout)
}

/// A pod that gives itself another address (an unused one of its node's
/// CIDR, and another pod's) and sends from it, TCP SYNs and UDP, to a pod
/// on its node and a pod on the other node: nothing arrives, the drops are
/// counted, and its own address still works.
fn spoofed_sources_reach_no_pod(mode: Mode, flags: &[&str]) {
    let services = ServiceCluster::flagged(mode, 2, flags);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let (spoofer, neighbour, local, remote) = (n1.pod(), n1.pod(), n1.pod(), n2.pod());
    services.program(&[]);
    for family in FAMILIES {
        let (unused, prefix) = match family {
            Family::V4 => ("10.244.1.200".parse::<IpAddr>().unwrap(), 24),
            Family::V6 => ("fd44:0:0:1::c8".parse::<IpAddr>().unwrap(), 64),
        };
        let stolen = pod_ip(&neighbour, family);
        for extra in [unused, stolen] {
            let mut add = vec!["ip", "addr", "add"];
            let cidr = format!("{extra}/{prefix}");
            add.extend([cidr.as_str(), "dev", "eth0"]);
            if family == Family::V6 {
                add.push("nodad");
            }
            spoofer.netns.exec(&add);
        }
        for target in [&local, &remote] {
            let to_ip = pod_ip(target, family);
            let listener = target
                .netns
                .run(|| TcpListener::bind((to_ip, 9000)))
                .expect("listen");
            listener.set_nonblocking(true).unwrap();
            let udp = target
                .netns
                .run(|| UdpSocket::bind((to_ip, 9001)))
                .expect("bind");
            udp.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            // The spoofer's own address works (and resolves the way there,
            // so what follows is the spoofed packets themselves).
            let own = SocketAddr::new(pod_ip(&spoofer, family), 0);
            spoofer
                .netns
                .run(|| tcp_connect_from(own, SocketAddr::new(to_ip, 9000), IO_TIMEOUT))
                .unwrap_or_else(|e| panic!("{mode:?} {family:?}: own address to {to_ip}: {e}"));
            drop(listener.accept().expect("the spoofer's own connection"));
            let dropped = n1.packets(action::DROPPED);
            // TCP from the unused address, UDP from the neighbour's.
            let syn = spoofer.netns.run(|| {
                tcp_connect_from(
                    SocketAddr::new(unused, 0),
                    SocketAddr::new(to_ip, 9000),
                    Duration::from_millis(1500),
                )
            });
            assert!(
                syn.is_err(),
                "{mode:?} {family:?}: a SYN from {unused} got an answer"
            );
            spoofer.netns.run(|| {
                let socket = UdpSocket::bind((stolen, 0)).expect("bind the stolen address");
                for _ in 0..3 {
                    socket.send_to(b"spoofed", (to_ip, 9001)).expect("send");
                }
            });
            let mut buf = [0u8; 64];
            assert!(
                udp.recv_from(&mut buf).is_err(),
                "{mode:?} {family:?}: a datagram from {stolen} reached {to_ip}"
            );
            assert!(
                listener.accept().is_err(),
                "{mode:?} {family:?}: a connection from {unused} reached {to_ip}"
            );
            let counted = n1.packets(action::DROPPED) - dropped;
            // At least the first SYN, its retransmission and the three
            // datagrams.
            assert!(counted >= 5, "{mode:?} {family:?}: {counted} drops counted");
        }
    }
}

#[flatnet_test(root)]
fn spoofed_sources_reach_no_pod_iptables() {
    spoofed_sources_reach_no_pod(Mode::Iptables, &[]);
}

#[flatnet_test(root)]
fn spoofed_sources_reach_no_pod_nftables() {
    spoofed_sources_reach_no_pod(Mode::Nftables, &[]);
}

#[flatnet_test(root)]
fn spoofed_sources_reach_no_pod_xdp() {
    spoofed_sources_reach_no_pod(Mode::Iptables, &["--datapath", "xdp"]);
}

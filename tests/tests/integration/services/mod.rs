//! Kubernetes Services next to flatnet's fast path: kube-proxy's own rule
//! shapes (iptables and nftables modes, `flatnet_tests::kube_proxy`) on the
//! simulated cluster's nodes (`flatnet_tests::cluster`), with real agents,
//! real pods and real traffic, over IPv4 and IPv6. Every case that the host
//! translates (ClusterIP, NodePort, hostPort, hairpin) must work as on the
//! reference bridge, and pod-to-pod traffic must keep the fast path.

use flatnet_harness::RecvThroughSignals;
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

mod cluster_ips;
pub(crate) mod node_and_host_ports;
mod spoofing;
pub(crate) mod under_load;

/// Where backends listen (a Service's targetPort).
const BACKEND_PORT: u16 = 8080;
const DNS_PORT: u16 = 53;
/// The NodePort the cases' Services get.
const NODE_PORT: u16 = 30080;
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
pub(crate) struct TcpBackend {
    stop: Arc<AtomicBool>,
    port: u16,
    netns_path: std::path::PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpBackend {
    pub(crate) fn start(pod: &SimPod, name: &str, port: u16) -> Self {
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
                        while let Ok(n) = conn.read_through_signals(&mut buf) {
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
                    let Ok((n, from)) = socket.recv_from_through_signals(&mut buf) else {
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
            let Ok((n, from)) = socket.recv_from_through_signals(&mut buf) else {
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

/// The cases' web Service of `family`: ClusterIP `cluster_ip(family, 10)`
/// port 80/TCP to `backends` on `BACKEND_PORT`.
fn web(family: Family, backends: &[&SimPod]) -> ServicePort {
    ServicePort::cluster_ip(
        &format!("web-{family:?}").to_lowercase(),
        cluster_ip(family, 10),
        80,
        Protocol::Tcp,
        backends
            .iter()
            .map(|pod| SocketAddr::new(pod_ip(pod, family), BACKEND_PORT))
            .collect(),
    )
}

/// The same web Service in both families.
fn web_in_both_families(backends: &[&SimPod]) -> Vec<ServicePort> {
    FAMILIES
        .iter()
        .map(|family| web(*family, backends))
        .collect()
}

/// The cases' DNS-like Service of `family`: ClusterIP
/// `cluster_ip(family, 53)` port 53/UDP to `backends` on `DNS_PORT`.
fn dns(family: Family, backends: &[&SimPod]) -> ServicePort {
    ServicePort::cluster_ip(
        &format!("dns-{family:?}").to_lowercase(),
        cluster_ip(family, 53),
        DNS_PORT,
        Protocol::Udp,
        backends
            .iter()
            .map(|pod| SocketAddr::new(pod_ip(pod, family), DNS_PORT))
            .collect(),
    )
}

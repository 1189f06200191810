//! The upstream Kubernetes e2e NetworkPolicy model with real traffic: on a
//! simulated cluster of two nodes whose agents follow an API server stub
//! (`--peer-source kubernetes`), namespaces x, y, z hold pods a, b, c (nine
//! pods spread over both nodes, made through the plugin the agents
//! installed), each serving TCP and UDP on ports 80 and 81 and answering with
//! its own name. For each case the policies go to the stub, the test waits
//! until both agents have computed and written them, then probes every pod
//! from every pod (9x9, TCP and UDP, 80 and 81, concurrently) and compares
//! the result with a reference model of NetworkPolicy written here, in the
//! test, from the same objects the stub serves (not the agent's code).
//!
//! Traffic from a pod to itself: the probe connects to the pod's own
//! address, which the pod's kernel delivers over its loopback, so no CNI
//! datapath ever sees it and it is always allowed. The model expects exactly
//! that in every case (upstream's `AllowLoopback`, which upstream's tables
//! do not apply in all of their deny cases), and the tests assert it: in the
//! deny cases too, a pod reaches itself.

use flatnet_harness::RecvThroughSignals;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind, ServedStub, api_namespace, api_pod, metric};
use flatnet_tests::*;
use ipnetwork::Ipv4Network;
use serde_json::{Value, json};

mod cluster_ips;
mod endpoint_slices;
mod first_packet;
mod reference;
mod under_traffic;
mod upstream_cases;
mod world;

use reference::*;
use world::*;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const NAMES: [&str; 3] = ["a", "b", "c"];
/// The stub's fixture nodes: cp-1 (172.30.0.1, 10.244.0.0/24) and worker-1
/// (172.30.0.2, 10.244.1.0/24).
const NODES: [(&str, u8, &str); 2] = [
    ("cp-1", 1, "10.244.0.0/24"),
    ("worker-1", 2, "10.244.1.0/24"),
];
const PORTS: [u16; 2] = [80, 81];
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn api(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
}

/// What one probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    /// An answer from the wrong pod, a refusal, an error: never right.
    Wrong(String),
}

/// One of the nine pods: its simulated pod, where it runs, and its servers.
struct ModelPod<'c> {
    namespace: &'static str,
    name: &'static str,
    node: &'static str,
    ip: Ipv4Addr,
    sim: SimPod<'c>,
}

impl ModelPod<'_> {
    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn netns(&self) -> PathBuf {
        self.sim.netns.path()
    }
}

/// Listener threads, stopped and joined on drop.
#[derive(Default)]
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// TCP on `port` in `netns`: each connection gets `answer`, then FIN.
    fn tcp(&mut self, netns: PathBuf, port: u16, answer: String) {
        let stop = self.stop.clone();
        let (ready, bound) = std::sync::mpsc::channel();
        self.threads.push(std::thread::spawn(move || {
            enter_thread(&netns).expect("enter the pod's netns");
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).expect("bind TCP");
            listener.set_nonblocking(true).expect("nonblocking");
            ready.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
                        let _ = conn.write_all(answer.as_bytes());
                    }
                    // Non-blocking accept: poll until told to stop.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
        bound.recv().expect("TCP server bound");
    }

    /// UDP on `port` in `netns`: each datagram is answered with `answer`.
    fn udp(&mut self, netns: PathBuf, port: u16, answer: String) {
        let stop = self.stop.clone();
        let (ready, bound) = std::sync::mpsc::channel();
        self.threads.push(std::thread::spawn(move || {
            enter_thread(&netns).expect("enter the pod's netns");
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).expect("bind UDP");
            socket
                .set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            ready.send(()).unwrap();
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((_, from)) = socket.recv_from_through_signals(&mut buf) {
                    let _ = socket.send_to(answer.as_bytes(), from);
                }
            }
        }));
        bound.recv().expect("UDP server bound");
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One probe from inside `from` (the calling thread enters it).
fn probe_once(from: &Path, to: Ipv4Addr, port: u16, proto: Proto, expect: &str) -> Outcome {
    if let Err(e) = enter_thread(from) {
        return Outcome::Wrong(format!("setns: {e}"));
    }
    let addr = SocketAddr::from((to, port));
    match proto {
        Proto::Tcp => {
            let mut conn = match TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) {
                Ok(conn) => conn,
                Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                    return Outcome::Denied;
                }
                Err(e) => return Outcome::Wrong(format!("connect: {e}")),
            };
            let _ = conn.set_read_timeout(Some(PROBE_TIMEOUT));
            let mut answer = String::new();
            match conn.read_to_string(&mut answer) {
                Ok(_) if answer == expect => Outcome::Allowed,
                // Connected, then the answer was cut: the policy changed
                // under the probe; a retry tells.
                Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                    Outcome::Denied
                }
                Ok(_) => Outcome::Wrong(format!("answered {answer:?}")),
                Err(e) => Outcome::Wrong(format!("read: {e}")),
            }
        }
        Proto::Udp => {
            let socket = match UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
                Ok(socket) => socket,
                Err(e) => return Outcome::Wrong(format!("bind: {e}")),
            };
            let _ = socket.set_read_timeout(Some(PROBE_TIMEOUT));
            if let Err(e) = socket.connect(addr).and_then(|_| socket.send(b"probe")) {
                return Outcome::Wrong(format!("send: {e}"));
            }
            let mut buf = [0u8; 512];
            match socket.recv_through_signals(&mut buf) {
                Ok(n) if &buf[..n] == expect.as_bytes() => Outcome::Allowed,
                Ok(n) => {
                    Outcome::Wrong(format!("answered {:?}", String::from_utf8_lossy(&buf[..n])))
                }
                Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                    Outcome::Denied
                }
                Err(e) => Outcome::Wrong(format!("recv: {e}")),
            }
        }
    }
}

/// A probe, retried once when it was not allowed (a flake is not a deny).
fn probe(from: &Path, to: Ipv4Addr, port: u16, proto: Proto, expect: &str) -> Outcome {
    match probe_once(from, to, port, proto, expect) {
        Outcome::Allowed => Outcome::Allowed,
        _ => probe_once(from, to, port, proto, expect),
    }
}

/// 9x9: [from][to].
type Table<T> = Vec<Vec<T>>;

/// What the probes and the model say of one port and protocol.
struct Matrix {
    port: u16,
    proto: Proto,
    actual: Table<Outcome>,
    expected: Table<bool>,
}

impl Matrix {
    fn mismatches(&self) -> usize {
        let mut n = 0;
        for (row, expected) in self.actual.iter().zip(&self.expected) {
            for (outcome, allowed) in row.iter().zip(expected) {
                if *outcome
                    != (if *allowed {
                        Outcome::Allowed
                    } else {
                        Outcome::Denied
                    })
                {
                    n += 1;
                }
            }
        }
        n
    }

    /// Upstream's truth table: rows from, columns to; `.` allowed, `X`
    /// denied; a mismatch shows what was seen in brackets.
    fn render(&self, ids: &[String]) -> String {
        let mut text = format!(
            "{} {} (rows from, columns to; `.` allowed, `X` denied; [c]: the probe saw c, \
             the model expects the other; [?]: a wrong answer)\n      ",
            self.proto.api(),
            self.port
        );
        for id in ids {
            text.push_str(&format!("{id:>5}"));
        }
        text.push('\n');
        let mut wrongs = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            text.push_str(&format!("{id:>5} "));
            for j in 0..ids.len() {
                let expected = self.expected[i][j];
                let cell = match (&self.actual[i][j], expected) {
                    (Outcome::Allowed, true) => "    .".to_string(),
                    (Outcome::Denied, false) => "    X".to_string(),
                    (Outcome::Allowed, false) => "  [.]".to_string(),
                    (Outcome::Denied, true) => "  [X]".to_string(),
                    (Outcome::Wrong(why), _) => {
                        wrongs.push(format!("{} -> {}: {why}", ids[i], ids[j]));
                        "  [?]".to_string()
                    }
                };
                text.push_str(&cell);
            }
            text.push('\n');
        }
        for wrong in wrongs {
            text.push_str(&format!("  {wrong}\n"));
        }
        text
    }
}

fn policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"namespace": namespace, "name": name}, "spec": spec})
}

fn only(pod: &str) -> Value {
    json!({"matchLabels": {"pod": pod}})
}

/// A pod object as the API has it before kubelet reports its sandbox: on
/// its node, without an IP.
fn pending_pod(namespace: &str, name: &str, node: &str) -> Value {
    json!({
        "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{namespace}-{name}"),
                     "labels": {"pod": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "agnhost"}]},
        "status": {"phase": "Pending"}
    })
}

/// Gives a pending pod the address kubelet reports once its containers run.
fn report_ip(stub: &ApiStub, namespace: &str, name: &str, ip: Ipv4Addr) {
    stub.modify(Kind::Pod, &format!("{namespace}/{name}"), |pod| {
        pod["status"] = json!({"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]});
    });
}

/// The policy flags of the local pod with `ip` on `node`.
fn policy_flags(node: &SimNode, ip: Ipv4Addr) -> u32 {
    let datapath = node.datapath();
    let slot = datapath
        .slot_of(IpAddr::V4(ip))
        .expect("ENDPOINTS")
        .expect("the pod's slot");
    datapath.pod_policy(slot).expect("POLICY_PODS").flags
}

/// kubelet's CNI_ARGS for pod `namespace/name`.
fn kubelet_args(namespace: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x"
    )
}

/// `namespace/deny-egress`: every pod of the namespace isolated for egress,
/// nothing allowed.
fn deny_all_egress(namespace: &str) -> Value {
    policy(
        namespace,
        "deny-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    )
}

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

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind, ServedStub, api_pod, metric};
use flatnet_tests::*;
use ipnetwork::Ipv4Network;
use serde_json::{Value, json};

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
                if let Ok((_, from)) = socket.recv_from(&mut buf) {
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
            match socket.recv(&mut buf) {
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

// ---------------------------------------------------------------------------
// The reference model: NetworkPolicy semantics on the stub's objects.

fn labels_of(object: &Value) -> &Value {
    &object["metadata"]["labels"]
}

/// A label selector (matchLabels and matchExpressions); `{}` selects all.
fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |key: &str| labels.get(key).and_then(Value::as_str);
    let labels_ok = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(key, value)| label(key) == value.as_str());
    let expressions_ok = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().expect("key");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().expect("operator") {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => !label(key).is_some_and(|v| values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                other => panic!("operator {other}"),
            }
        });
    labels_ok && expressions_ok
}

/// A pod as the model sees it: the stub's object and its namespace's.
struct Subject<'a> {
    pod: &'a Value,
    namespace: &'a Value,
}

impl Subject<'_> {
    fn ns(&self) -> &str {
        self.pod["metadata"]["namespace"].as_str().unwrap()
    }

    fn ip(&self) -> Ipv4Addr {
        self.pod["status"]["podIP"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The container port named `name` for `proto`.
    fn named_port(&self, name: &str, proto: Proto) -> Option<u16> {
        self.pod["spec"]["containers"]
            .as_array()?
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| {
                p["name"].as_str() == Some(name)
                    && p["protocol"].as_str().unwrap_or("TCP") == proto.api()
            })
            .and_then(|p| p["containerPort"].as_u64())
            .map(|p| p as u16)
    }
}

/// Whether `peer` (one entry of `from` or `to`) of a policy in
/// `policy_ns` matches `other`.
fn peer_matches(peer: &Value, policy_ns: &str, other: &Subject) -> bool {
    if let Some(block) = peer.get("ipBlock") {
        let cidr: Ipv4Network = block["cidr"].as_str().unwrap().parse().unwrap();
        let excepted = block["except"].as_array().into_iter().flatten().any(|e| {
            let e: Ipv4Network = e.as_str().unwrap().parse().unwrap();
            e.contains(other.ip())
        });
        return cidr.contains(other.ip()) && !excepted;
    }
    let namespace_ok = match peer.get("namespaceSelector") {
        Some(selector) => selects(selector, labels_of(other.namespace)),
        None => other.ns() == policy_ns,
    };
    let pod_ok = match peer.get("podSelector") {
        Some(selector) => selects(selector, labels_of(other.pod)),
        None => true,
    };
    namespace_ok && pod_ok
}

/// Whether a rule's `ports` let `port`/`proto` of `dst` through.
fn ports_match(ports: &Value, dst: &Subject, port: u16, proto: Proto) -> bool {
    let Some(ports) = ports.as_array().filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|entry| {
        if entry["protocol"].as_str().unwrap_or("TCP") != proto.api() {
            return false;
        }
        match &entry["port"] {
            Value::Null => true,
            Value::Number(n) => {
                let first = n.as_u64().unwrap() as u16;
                let last = entry["endPort"].as_u64().map_or(first, |p| p as u16);
                (first..=last).contains(&port)
            }
            Value::String(name) => dst.named_port(name, proto) == Some(port),
            other => panic!("port {other}"),
        }
    })
}

/// Whether `policy` isolates its pods for ingress / egress.
fn policy_types(policy: &Value) -> (bool, bool) {
    match policy["spec"]["policyTypes"].as_array() {
        Some(types) => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        None => (true, policy["spec"].get("egress").is_some()),
    }
}

/// Whether the policies let `subject` (ingress: the destination; egress:
/// the source) talk with `peer`, the connection going to `dst`'s port.
fn direction_allows(
    policies: &[Value],
    ingress: bool,
    subject: &Subject,
    peer: &Subject,
    dst: &Subject,
    port: u16,
    proto: Proto,
) -> bool {
    let (rules_key, peers_key) = if ingress {
        ("ingress", "from")
    } else {
        ("egress", "to")
    };
    let selecting: Vec<&Value> = policies
        .iter()
        .filter(|p| {
            p["metadata"]["namespace"].as_str() == Some(subject.ns())
                && selects(&p["spec"]["podSelector"], labels_of(subject.pod))
                && {
                    let (i, e) = policy_types(p);
                    if ingress { i } else { e }
                }
        })
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|policy| {
        let policy_ns = policy["metadata"]["namespace"].as_str().unwrap();
        policy["spec"][rules_key]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let peers_ok = match rule[peers_key].as_array().filter(|p| !p.is_empty()) {
                    None => true,
                    Some(peers) => peers.iter().any(|p| peer_matches(p, policy_ns, peer)),
                };
                peers_ok && ports_match(&rule["ports"], dst, port, proto)
            })
    })
}

/// The expected 9x9 table of `port`/`proto` for the stub's objects now.
fn model(stub: &ApiStub, ids: &[String], port: u16, proto: Proto) -> Table<bool> {
    let policies = stub.list(Kind::NetworkPolicy);
    let pods: Vec<Value> = ids
        .iter()
        .map(|id| stub.get(Kind::Pod, id).expect("pod in the stub"))
        .collect();
    let namespaces: Vec<Value> = pods
        .iter()
        .map(|p| {
            stub.get(
                Kind::Namespace,
                p["metadata"]["namespace"].as_str().unwrap(),
            )
            .expect("namespace in the stub")
        })
        .collect();
    let subjects: Vec<Subject> = pods
        .iter()
        .zip(&namespaces)
        .map(|(pod, namespace)| Subject { pod, namespace })
        .collect();
    subjects
        .iter()
        .enumerate()
        .map(|(i, src)| {
            subjects
                .iter()
                .enumerate()
                .map(|(j, dst)| {
                    // Loopback: never seen by any datapath.
                    i == j
                        || (direction_allows(&policies, false, src, dst, dst, port, proto)
                            && direction_allows(&policies, true, dst, src, dst, port, proto))
                })
                .collect()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The cluster, the pods, the stub.

fn api_namespace(name: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"ns": name, "kubernetes.io/metadata.name": name}}})
}

/// Upstream's pod: one container per port and protocol, ports named
/// `serve-<port>-<tcp|udp>`.
fn model_pod(pod: &ModelPod) -> Value {
    let containers: Vec<Value> = PORTS
        .iter()
        .flat_map(|port| {
            [Proto::Tcp, Proto::Udp].map(|proto| {
                let lower = proto.api().to_lowercase();
                json!({
                    "name": format!("cont-{port}-{lower}"),
                    "image": "agnhost",
                    "ports": [{"name": format!("serve-{port}-{lower}"), "containerPort": port, "protocol": proto.api()}]
                })
            })
        })
        .collect();
    let labels = json!({"pod": pod.name});
    api_pod(
        pod.namespace,
        pod.name,
        pod.node,
        IpAddr::V4(pod.ip),
        labels,
        json!(containers),
    )
}

/// The model world: the stub (served on each node's loopback), nine pods
/// with their servers. Built on a cluster the test owns.
struct World<'c> {
    cluster: &'c Cluster,
    stub: ApiStub,
    // Dropped in this order: servers first, then the pods (DEL), then the
    // stub's servers.
    _servers: Servers,
    pods: Vec<ModelPod<'c>>,
    _served: Vec<ServedStub>,
    ids: Vec<String>,
}

fn cluster() -> Cluster {
    let specs: Vec<NodeSpec> = specs(
        &NODES
            .iter()
            .map(|(name, index, cidr)| (*name, *index, Some(*cidr)))
            .collect::<Vec<_>>(),
    );
    Cluster::new(&specs)
}

impl<'c> World<'c> {
    fn new(cluster: &'c Cluster) -> Self {
        let stub = ApiStub::from_fixture();
        for namespace in NAMESPACES {
            stub.add(Kind::Namespace, api_namespace(namespace));
        }
        // One stub, served on each node's own loopback, where its agent runs.
        let served = cluster.start_agents_on_api(&stub);
        let mut pods = Vec::new();
        let mut servers = Servers::default();
        for (i, (namespace, name)) in NAMESPACES
            .iter()
            .flat_map(|ns| NAMES.iter().map(move |n| (*ns, *n)))
            .enumerate()
        {
            let node = &cluster.nodes[i % cluster.nodes.len()];
            let sim = node.pod();
            let pod = ModelPod {
                namespace,
                name,
                node: NODES[i % NODES.len()].0,
                ip: sim.ip,
                sim,
            };
            for port in PORTS {
                servers.tcp(pod.netns(), port, pod.id());
                servers.udp(pod.netns(), port, pod.id());
            }
            pods.push(pod);
        }
        let ids = pods.iter().map(ModelPod::id).collect();
        let world = World {
            cluster,
            stub,
            _servers: servers,
            pods,
            _served: served,
            ids,
        };
        world.apply(|stub| {
            for pod in &world.pods {
                stub.add(Kind::Pod, model_pod(pod));
            }
        });
        world
    }

    fn pod(&self, id: &str) -> &ModelPod<'c> {
        self.pods.iter().find(|p| p.id() == id).expect("pod")
    }

    fn node_of(&self, id: &str) -> &'c SimNode {
        self.cluster.node(self.pod(id).node)
    }

    fn metric_of_nodes(&self, series: &str) -> Vec<f64> {
        self.cluster
            .nodes
            .iter()
            .map(|n| metric(&n.metrics(), series).unwrap_or(0.0))
            .collect()
    }

    /// Makes `change` in the stub and waits until both agents have
    /// computed and written it: each node's computation count has grown
    /// and then stayed still for 300 ms (every event of the stub makes a
    /// computation within ~10 ms, and the write follows it in the same
    /// pass); no policy error on either node.
    fn apply(&self, change: impl FnOnce(&ApiStub)) {
        let computes = || self.metric_of_nodes("flatnet_policy_compute_seconds_count");
        let before = computes();
        change(&self.stub);
        wait_until("both agents to compute the change", SETTLE, || {
            computes().iter().zip(&before).all(|(now, was)| now > was)
        });
        let mut last = computes();
        // Settled: no further computation within a 300 ms window (the
        // agent coalesces events for 10 ms), the window being the point.
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = computes();
            if now == last {
                break;
            }
            last = now;
        }
        let errors = self.metric_of_nodes("flatnet_policy_errors_total");
        assert!(
            errors.iter().all(|e| *e == 0.0),
            "policy errors on the nodes: {errors:?}\n{}",
            self.logs()
        );
    }

    fn logs(&self) -> String {
        self.cluster
            .nodes
            .iter()
            .map(|n| format!("--- agent of {}:\n{}", n.spec.name, n.agent_log()))
            .collect()
    }

    fn policy(&self, policy: Value) {
        self.apply(|stub| stub.add(Kind::NetworkPolicy, policy));
    }

    /// Takes every policy away.
    fn clear_policies(&self) {
        let keys: Vec<String> = self
            .stub
            .list(Kind::NetworkPolicy)
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap(),
                    p["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        if keys.is_empty() {
            return;
        }
        self.apply(|stub| {
            for key in &keys {
                stub.delete(Kind::NetworkPolicy, key);
            }
        });
    }

    /// Probes all 9x9 pairs of every port and protocol at once (324
    /// threads) and computes the model's tables.
    fn probe_all(&self) -> Vec<Matrix> {
        let cases: Vec<(u16, Proto)> = PORTS
            .iter()
            .flat_map(|port| [(*port, Proto::Tcp), (*port, Proto::Udp)])
            .collect();
        let actual: Vec<Table<Outcome>> = std::thread::scope(|scope| {
            let handles: Vec<Vec<Vec<_>>> = cases
                .iter()
                .map(|&(port, proto)| {
                    self.pods
                        .iter()
                        .map(|from| {
                            self.pods
                                .iter()
                                .map(|to| {
                                    let (netns, ip, id) = (from.netns(), to.ip, to.id());
                                    scope.spawn(move || probe(&netns, ip, port, proto, &id))
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            handles
                .into_iter()
                .map(|table| {
                    table
                        .into_iter()
                        .map(|row| row.into_iter().map(|h| h.join().unwrap()).collect())
                        .collect()
                })
                .collect()
        });
        cases
            .into_iter()
            .zip(actual)
            .map(|((port, proto), actual)| Matrix {
                port,
                proto,
                expected: model(&self.stub, &self.ids, port, proto),
                actual,
            })
            .collect()
    }

    /// Probes everything and compares with the model; panics with the
    /// tables on a mismatch. `must_deny`: the model must expect some
    /// denial (else the case proves nothing). Returns the probe count.
    fn check(&self, case: &str, must_deny: bool) -> usize {
        let start = Instant::now();
        let matrices = self.probe_all();
        let expected_denied: usize = matrices
            .iter()
            .map(|m| m.expected.iter().flatten().filter(|a| !**a).count())
            .sum();
        let expected_allowed: usize = matrices
            .iter()
            .map(|m| m.expected.iter().flatten().filter(|a| **a).count())
            .sum();
        let mismatches: usize = matrices.iter().map(Matrix::mismatches).sum();
        let probes = matrices.len() * self.ids.len() * self.ids.len();
        if mismatches > 0 {
            let tables: String = matrices.iter().map(|m| m.render(&self.ids)).collect();
            panic!(
                "case {case:?}: {mismatches} of {probes} probes differ from the model\n{tables}\npolicies: {:#}\n{}",
                Value::Array(self.stub.list(Kind::NetworkPolicy)),
                self.logs()
            );
        }
        assert!(
            expected_allowed > 0,
            "case {case:?}: the model allows nothing"
        );
        if must_deny {
            assert!(
                expected_denied > 0,
                "case {case:?}: the model denies nothing"
            );
        } else {
            assert_eq!(expected_denied, 0, "case {case:?}: the model denies some");
        }
        eprintln!(
            "case {case}: {probes} probes match the model ({expected_allowed} allowed, {expected_denied} denied) in {:.2?}",
            start.elapsed()
        );
        if std::env::var_os("NETPOL_TABLES").is_some() {
            for m in &matrices {
                eprintln!("{}", m.render(&self.ids));
            }
        }
        probes
    }

    /// One policy case from a clean slate: apply, check, clear.
    fn case(&self, case: &str, policies: Vec<Value>) {
        self.apply(|stub| {
            for policy in policies {
                stub.add(Kind::NetworkPolicy, policy);
            }
        });
        self.check(case, true);
        self.clear_policies();
    }
}

fn policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"namespace": namespace, "name": name}, "spec": spec})
}

fn only(pod: &str) -> Value {
    json!({"matchLabels": {"pod": pod}})
}

#[flatnet_test(root)]
fn the_upstream_e2e_policy_cases_match_the_model() {
    let cluster = cluster();
    let world = World::new(&cluster);
    // Sanity: the pods are where they should be, spread over both nodes,
    // and without policy everything is allowed.
    assert!(world.pod("x/a").ip.octets()[2] != world.pod("x/b").ip.octets()[2]);
    world.check("no policy", false);

    world.case(
        "default deny ingress (x)",
        vec![policy(
            "x",
            "deny-ingress",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )],
    );
    world.case(
        "default deny egress (x)",
        vec![policy(
            "x",
            "deny-egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        )],
    );
    // Deny everything both ways in x, then allow all ingress: the union
    // lets all in, egress stays denied.
    world.case(
        "deny all in x, allow all ingress",
        vec![
            policy(
                "x",
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            ),
            policy(
                "x",
                "allow-all-ingress",
                json!({"podSelector": {}, "ingress": [{}]}),
            ),
        ],
    );
    world.case(
        "allow ingress to x/a from namespace y",
        vec![policy(
            "x",
            "a-from-y",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        )],
    );
    world.case(
        "ingress to x/a from pod b in namespaces y or z (AND in one peer)",
        vec![policy(
            "x",
            "a-from-b-in-yz",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [{
                       "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]},
                       "podSelector": only("b")}]}]}),
        )],
    );
    world.case(
        "ingress to x/a from namespace y or pod b of x (OR of two peers)",
        vec![policy(
            "x",
            "a-from-y-or-b",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [
                       {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}},
                       {"podSelector": only("b")}]}]}),
        )],
    );
    // worker-1's pods, less one of them.
    let excepted = world.pod("y/a").ip;
    assert_eq!(world.pod("y/a").node, "worker-1");
    world.case(
        "ingress to x from an ipBlock with except",
        vec![policy(
            "x",
            "from-worker-1-block",
            json!({"podSelector": {},
                   "ingress": [{"from": [{"ipBlock": {"cidr": NODES[1].2, "except": [format!("{excepted}/32")]}}]}]}),
        )],
    );
    world.case(
        "egress of y to an ipBlock (cp-1's pods)",
        vec![policy(
            "y",
            "to-cp-1-block",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": NODES[0].2}}]}]}),
        )],
    );
    world.case(
        "named ports: ingress to x/a on serve-81-tcp, egress of x/b to serve-80-udp",
        vec![
            policy(
                "x",
                "a-named",
                json!({"podSelector": only("a"),
                       "ingress": [{"ports": [{"port": "serve-81-tcp", "protocol": "TCP"}]}]}),
            ),
            policy(
                "x",
                "b-named-egress",
                json!({"podSelector": only("b"), "policyTypes": ["Egress"],
                       "egress": [{"ports": [{"port": "serve-80-udp", "protocol": "UDP"}]}]}),
            ),
        ],
    );
    world.case(
        "endPort: ingress to y/a on TCP 79-80 and UDP 81-82",
        vec![policy(
            "y",
            "a-ranges",
            json!({"podSelector": only("a"),
                   "ingress": [{"ports": [
                       {"port": 79, "endPort": 80, "protocol": "TCP"},
                       {"port": 81, "endPort": 82, "protocol": "UDP"}]}]}),
        )],
    );
    world.case(
        "two policies on z/c (union)",
        vec![
            policy(
                "z",
                "c-from-x-tcp-80",
                json!({"podSelector": only("c"),
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}],
                                    "ports": [{"port": 80}]}]}),
            ),
            policy(
                "z",
                "c-from-pods-a",
                json!({"podSelector": only("c"),
                       "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": only("a")}]}]}),
            ),
        ],
    );
    world.case(
        "ingress and egress: z/b from x only, to y only on UDP",
        vec![policy(
            "z",
            "b-both",
            json!({"podSelector": only("b"), "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}],
                   "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                               "ports": [{"protocol": "UDP"}]}]}),
        )],
    );
    world.check("all policies gone", false);
}

/// Probes `pairs` (from, to) on TCP 80 over and over on threads until
/// stopped; each result with when its probe began.
struct ProbeLoop {
    stop: Arc<AtomicBool>,
    results: Arc<Mutex<Vec<(Instant, String, Outcome)>>>,
    threads: Vec<JoinHandle<()>>,
}

impl ProbeLoop {
    fn start(world: &World, pairs: &[(&str, &str)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let results = Arc::new(Mutex::new(Vec::new()));
        let threads = pairs
            .iter()
            .map(|(from, to)| {
                let (stop, results) = (stop.clone(), results.clone());
                let netns = world.pod(from).netns();
                let (ip, expect) = (world.pod(to).ip, to.to_string());
                let pair = format!("{from}->{to}");
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        let outcome = probe_once(&netns, ip, 80, Proto::Tcp, &expect);
                        results.lock().unwrap().push((began, pair.clone(), outcome));
                        // The probe interval: the timeline's resolution.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            })
            .collect();
        ProbeLoop {
            stop,
            results,
            threads,
        }
    }

    fn stop(mut self) -> Vec<(Instant, String, Outcome)> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread.join().unwrap();
        }
        std::mem::take(&mut *self.results.lock().unwrap())
    }
}

/// What the loop saw of `pair` in probes begun in [from, to).
fn seen(
    results: &[(Instant, String, Outcome)],
    pair: &str,
    from: Instant,
    to: Instant,
) -> Vec<Outcome> {
    results
        .iter()
        .filter(|(began, p, _)| p == pair && *began >= from && *began < to)
        .map(|(_, _, o)| o.clone())
        .collect()
}

/// A paced TCP stream from `client` to a server on port 82 of `server`,
/// counting what arrives.
struct Stream {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Stream {
    fn start(server: &ModelPod, client: &ModelPod) -> Self {
        let (received, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let listener = server
            .sim
            .netns
            .run(|| TcpListener::bind((server.ip, 0)).unwrap());
        let addr = listener.local_addr().unwrap();
        let receiver = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                conn.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    match conn.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            received.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                        Err(_) => return,
                    }
                }
            })
        };
        let client_ns = client.netns();
        let sender = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                enter_thread(&client_ns).unwrap();
                let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
                conn.set_write_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let chunk = vec![7u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    match conn.write(&chunk) {
                        Ok(_) => {}
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                        Err(_) => return,
                    }
                    // Paced: a steady trickle, not a flood of the test's CPU.
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Stream {
            received,
            stop,
            threads: vec![receiver, sender],
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Bytes that arrived in `window`.
    fn flow(&self, window: Duration) -> u64 {
        let before = self.received();
        std::thread::sleep(window);
        self.received() - before
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[flatnet_test(root)]
fn policy_changes_under_traffic_follow_the_model() {
    let cluster = cluster();
    let world = World::new(&cluster);

    // A policy updated, then deleted, while probes run: x/a from y only,
    // then from z only, then no policy. y/b is on x/a's node, z/b not.
    let from_ns = |ns: &str| {
        policy(
            "x",
            "a-from",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": ns}}}]}]}),
        )
    };
    world.policy(from_ns("y"));
    world.check("x/a from y", true);
    let (from_y, from_z) = ("y/b->x/a", "z/b->x/a");
    let looping = Instant::now();
    let probes = ProbeLoop::start(&world, &[("y/b", "x/a"), ("z/b", "x/a")]);
    // Fixed phases of a timeline (before, after the add, after the delete):
    // each must hold long enough for the probes to show its state.
    std::thread::sleep(Duration::from_millis(700));
    let changed = Instant::now();
    world.apply(|stub| stub.add(Kind::NetworkPolicy, from_ns("z")));
    let written = Instant::now();
    std::thread::sleep(Duration::from_millis(1200));
    let deleting = Instant::now();
    world.apply(|stub| stub.delete(Kind::NetworkPolicy, "x/a-from"));
    let deleted = Instant::now();
    std::thread::sleep(Duration::from_millis(1200));
    let end = Instant::now();
    let results = probes.stop();
    let phases = [
        ("before the update", looping, changed, true, false),
        (
            "after the update was written",
            written,
            deleting,
            false,
            true,
        ),
        ("after the delete was written", deleted, end, true, true),
    ];
    for (phase, from, to, y_allowed, z_allowed) in phases {
        for (pair, allowed) in [(from_y, y_allowed), (from_z, z_allowed)] {
            let outcomes = seen(&results, pair, from, to);
            let want = if allowed {
                Outcome::Allowed
            } else {
                Outcome::Denied
            };
            assert!(
                !outcomes.is_empty() && outcomes.iter().all(|o| *o == want),
                "{pair} {phase}: want {want:?}, saw {outcomes:?}"
            );
        }
    }
    eprintln!("probe loop: {} probes", results.len());
    world.check("x/a from y, then z, then deleted", false);

    // A pod relabelled: x/a admits pods labelled b of any namespace; y/c
    // becomes one, then is restored.
    world.policy(policy(
        "x",
        "a-from-b",
        json!({"podSelector": only("a"),
               "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": only("b")}]}]}),
    ));
    let yc = world.pod("y/c");
    let allowed_yc = |world: &World| model(&world.stub, &world.ids, 80, Proto::Tcp)[5][0];
    assert_eq!(world.ids[5], "y/c");
    assert!(!allowed_yc(&world));
    assert_eq!(
        probe(&yc.netns(), world.pod("x/a").ip, 80, Proto::Tcp, "x/a"),
        Outcome::Denied
    );
    world.check("x/a from pods b", true);
    world.apply(|stub| {
        stub.modify(Kind::Pod, "y/c", |p| {
            p["metadata"]["labels"]["pod"] = json!("b");
        })
    });
    assert!(allowed_yc(&world), "the model follows the relabel");
    world.check("y/c relabelled pod=b", true);
    world.apply(|stub| {
        stub.modify(Kind::Pod, "y/c", |p| {
            p["metadata"]["labels"]["pod"] = json!("c");
        })
    });
    world.check("y/c labelled back", true);
    world.clear_policies();

    // A namespace relabelled: y admits namespaces labelled ns=x; z takes
    // that label, then gives it back.
    world.policy(policy(
        "y",
        "from-ns-x",
        json!({"podSelector": {},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}]}),
    ));
    world.check("y from ns=x", true);
    world.apply(|stub| {
        stub.modify(Kind::Namespace, "z", |n| {
            n["metadata"]["labels"]["ns"] = json!("x");
        })
    });
    assert!(
        model(&world.stub, &world.ids, 81, Proto::Udp)[6][3],
        "z/a -> y/a"
    );
    world.check("namespace z relabelled ns=x", true);
    world.apply(|stub| {
        stub.modify(Kind::Namespace, "z", |n| {
            n["metadata"]["labels"]["ns"] = json!("z");
        })
    });
    world.check("namespace z labelled back", true);
    world.clear_policies();

    // Established streams into x/a (from y/b on its node, from y/a on the
    // other) when an ingress policy arrives: one that still allows them
    // leaves them alone; then a deny cuts them at their next packet (the
    // datapath judges a flow again once the pod's generation moved).
    let xa = world.pod("x/a");
    let streams = [
        Stream::start(xa, world.pod("y/b")),
        Stream::start(xa, world.pod("y/a")),
    ];
    assert_eq!(world.pod("y/b").node, xa.node);
    assert_ne!(world.pod("y/a").node, xa.node);
    let window = Duration::from_millis(500);
    for stream in &streams {
        wait_until("the stream to flow", SETTLE, || stream.received() > 0);
    }
    world.policy(policy(
        "x",
        "a-from-y",
        json!({"podSelector": only("a"),
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    ));
    for stream in &streams {
        assert!(
            stream.flow(window) > 0,
            "an ingress policy that allows the stream stopped it"
        );
    }
    let node = world.node_of("x/a");
    let slot = node
        .datapath()
        .slot_of(IpAddr::V4(xa.ip))
        .unwrap()
        .expect("x/a's slot");
    let drops_before = node.datapath().policy_drops(slot).unwrap().0;
    world.policy(policy(
        "x",
        "a-from-y",
        json!({"podSelector": only("a"), "policyTypes": ["Ingress"]}),
    ));
    // What was in flight when the write landed may still arrive.
    std::thread::sleep(Duration::from_millis(300));
    for (stream, from) in streams.iter().zip(["y/b", "y/a"]) {
        let flowed = stream.flow(Duration::from_millis(1500));
        assert_eq!(
            flowed,
            0,
            "the established stream from {from} still flows after x/a's ingress was denied \
             ({flowed} bytes in 1.5 s; x/a's ingress drops {} -> {})\n{}",
            drops_before,
            node.datapath().policy_drops(slot).unwrap().0,
            world.logs()
        );
    }
    let drops = node.datapath().policy_drops(slot).unwrap().0;
    assert!(
        drops > drops_before,
        "x/a's ingress drops did not grow: {drops_before} -> {drops}"
    );
    drop(streams);
    world.check("x/a denies all ingress", true);
    world.clear_policies();
    world.check("all policies gone", false);
}

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
            matches!(socket.recv(&mut buf), Err(e) if e.kind() == ErrorKind::ConnectionRefused)
        })
    })
    .join()
    .expect("probe thread")
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

/// A pod's own UDP probes of one server from the instant its namespace
/// exists (before ADD gave it an interface): how many were sent, and how
/// many answered.
struct FirstPacketProber {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl FirstPacketProber {
    fn start(netns: PathBuf, to: Ipv4Addr, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent, answered) = (stop.clone(), sent.clone(), answered.clone());
            std::thread::spawn(move || {
                enter_thread(&netns).expect("enter the pod's netns");
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    // A new socket each time: the route may appear any moment.
                    let Ok(socket) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) else {
                        continue;
                    };
                    let _ = socket.set_read_timeout(Some(Duration::from_millis(20)));
                    if socket.send_to(b"probe", (to, port)).is_err() {
                        // No interface or route yet: ADD has not run; try
                        // again at once (the first packet is the point).
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    if socket.recv(&mut buf).is_ok() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        FirstPacketProber {
            stop,
            sent,
            answered,
            thread: Some(thread),
        }
    }

    /// (sent, answered) so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.answered.load(Ordering::Relaxed),
        )
    }
}

impl Drop for FirstPacketProber {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
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

/// `namespace/deny-egress`: every pod of the namespace isolated for egress,
/// nothing allowed.
fn deny_all_egress(namespace: &str) -> Value {
    policy(
        namespace,
        "deny-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    )
}

/// kubelet's CNI_ARGS for pod `namespace/name`.
fn kubelet_args(namespace: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x"
    )
}

/// Upstream e2e's failing shape, kept: a pod created after a policy that
/// denies its egress, probing from its very first instant, must never get
/// an answer, though kubelet reports its address seconds later. ADD starts
/// it isolated as its namespace's policies are (`isolation-<net>.json`),
/// and records who it is for the agent, which writes its real policy (or
/// opens it) at once. Also: a namespace without policies starts open, a
/// pod its namespace's policies do not select is opened within moments,
/// and with the agent down a new pod stays isolated until it is back.
#[flatnet_test(root)]
fn a_new_pod_is_held_to_its_policies_from_its_first_packet() {
    let cluster = cluster();
    let stub = ApiStub::from_fixture();
    for namespace in NAMESPACES {
        stub.add(Kind::Namespace, api_namespace(namespace));
    }
    let served = cluster.start_agents_on_api(&stub);
    let n1 = &cluster.nodes[0];
    let node_name = n1.spec.name.as_str();
    let server = n1.pod();
    let mut servers = Servers::default();
    servers.udp(server.netns.path(), 80, "y/server".into());
    servers.tcp(server.netns.path(), 80, "y/server".into());
    stub.add(Kind::Pod, pending_pod("y", "server", node_name));
    report_ip(&stub, "y", "server", server.ip);
    // x: every pod's egress denied; z: only pod a's ingress isolated.
    stub.add(Kind::NetworkPolicy, deny_all_egress("x"));
    stub.add(
        Kind::NetworkPolicy,
        policy(
            "z",
            "a-ingress",
            json!({"podSelector": only("a"), "policyTypes": ["Ingress"]}),
        ),
    );
    use flatnet_datapath::node::first_packet::{Directions, Isolation};
    wait_until(
        "the agent to write the namespaces' isolation",
        SETTLE,
        || {
            Isolation::read(&n1.network).is_some_and(|i| {
                i.listed
                    && i.namespaces.get("x")
                        == Some(&Directions {
                            ingress: false,
                            egress: true,
                        })
                    && i.namespaces.get("z")
                        == Some(&Directions {
                            ingress: true,
                            egress: false,
                        })
                    && !i.namespaces.contains_key("y")
            })
        },
    );

    // x/c: in the API before its sandbox, probing from its first instant.
    stub.add(Kind::Pod, pending_pod("x", "c", node_name));
    let netns = Netns::new();
    let prober = FirstPacketProber::start(netns.path(), server.ip, 80);
    let c = n1.pod_in(netns, &kubelet_args("x", "c"));
    assert_eq!(
        policy_flags(n1, c.ip) & flatnet_common::POLICY_F_EGRESS,
        flatnet_common::POLICY_F_EGRESS,
        "isolated for egress when ADD returned"
    );
    // kubelet reports the address once the containers run: seconds later.
    std::thread::sleep(Duration::from_secs(2));
    report_ip(&stub, "x", "c", c.ip);
    // And probes go on for a second after it: none may get through then either.
    std::thread::sleep(Duration::from_secs(1));
    let (sent, answered) = prober.counts();
    drop(prober);
    eprintln!("x/c from its first instant: {sent} probes sent, {answered} answered");
    assert!(sent > 50, "the prober hardly ran: {sent}");
    assert_eq!(
        answered, 0,
        "a probe got through before or after its policy"
    );
    // The egress denial is the agent's by now, not just ADD's start.
    assert_eq!(
        probe(&c.netns.path(), server.ip, 80, Proto::Tcp, "y/server"),
        Outcome::Denied
    );

    // y/d: no policy in its namespace: open from the start.
    stub.add(Kind::Pod, pending_pod("y", "d", node_name));
    let d = n1.pod_in(Netns::new(), &kubelet_args("y", "d"));
    assert_eq!(policy_flags(n1, d.ip), 0, "y has no policies");
    assert_eq!(
        probe(&d.netns.path(), server.ip, 80, Proto::Udp, "y/server"),
        Outcome::Allowed
    );

    // z/c: z's policy selects pod a only. z/c starts isolated for ingress
    // and is opened once the agent saw its record: no IP in the API yet.
    stub.add(Kind::Pod, pending_pod("z", "c", node_name));
    let zc = n1.pod_in(Netns::new(), &kubelet_args("z", "c"));
    servers.udp(zc.netns.path(), 80, "z/c".into());
    let started = Instant::now();
    let opened = poll_until(SETTLE, POLL_INTERVAL, || {
        probe_once(&server.netns.path(), zc.ip, 80, Proto::Udp, "z/c") == Outcome::Allowed
    });
    assert!(
        opened,
        "z/c, selected by no policy, was not opened:\n{}",
        n1.agent_log()
    );
    eprintln!("z/c opened {:?} after its ADD", started.elapsed());
    assert_eq!(policy_flags(n1, zc.ip), 0);

    // The agent down: a new pod of x starts isolated and stays so.
    n1.stop_agent();
    stub.add(Kind::Pod, pending_pod("x", "e", node_name));
    let e = n1.pod_in(Netns::new(), &kubelet_args("x", "e"));
    assert_eq!(
        probe(&e.netns.path(), server.ip, 80, Proto::Udp, "y/server"),
        Outcome::Denied,
        "with the agent down"
    );
    // Back, it follows the API: x's policy deleted, x/e is opened.
    n1.start_agent(&Peers::Api(served[0].url.clone()));
    n1.wait_ready();
    stub.delete(Kind::NetworkPolicy, "x/deny-egress");
    wait_until("x/e to be opened once its policy is gone", SETTLE, || {
        probe_once(&e.netns.path(), server.ip, 80, Proto::Udp, "y/server") == Outcome::Allowed
    });
    let errors = metric(&n1.metrics(), "flatnet_policy_errors_total").unwrap_or(0.0);
    assert_eq!(errors, 0.0, "{}", n1.agent_log());
}

/// Kubernetes 1.17-1.20 serve EndpointSlices as discovery.k8s.io/v1beta1
/// only: the agent reads them there and enforces policy. An API server
/// without them at all leaves NetworkPolicy down, and the agent says so
/// (`/readyz`, the feature gauge, CNI STATUS), while new pods start
/// isolated both ways: never silently open.
#[flatnet_test(root)]
fn endpoint_slices_of_kubernetes_1_20_or_none_at_all() {
    let (policy_ready, policy_down) = (
        "flatnet_agent_feature_ready{feature=\"network_policy\"} 1",
        "flatnet_agent_feature_ready{feature=\"network_policy\"} 0",
    );
    // Kubernetes 1.20: v1beta1 only.
    {
        let cluster = cluster();
        let stub = ApiStub::from_fixture();
        stub.serve_slices_as("v1beta1");
        for namespace in NAMESPACES {
            stub.add(Kind::Namespace, api_namespace(namespace));
        }
        let _served = cluster.start_agents_on_api(&stub);
        let n1 = &cluster.nodes[0];
        wait_until("NetworkPolicy up on v1beta1 EndpointSlices", SETTLE, || {
            n1.metrics().contains(policy_ready)
        });
        assert!(n1.agent_log().contains("discovery.k8s.io/v1beta1"));
        assert!(
            n1.agent_http("/readyz").starts_with("HTTP/1.0 200"),
            "{}",
            n1.agent_http("/readyz")
        );
        stub.add(Kind::NetworkPolicy, deny_all_egress("x"));
        stub.add(Kind::Pod, pending_pod("x", "a", &n1.spec.name));
        let pod = n1.pod_in(Netns::new(), &kubelet_args("x", "a"));
        wait_until("x/a's egress isolation written", SETTLE, || {
            policy_flags(n1, pod.ip) == flatnet_common::POLICY_F_EGRESS
        });
        let errors = metric(&n1.metrics(), "flatnet_policy_errors_total").unwrap_or(0.0);
        assert_eq!(errors, 0.0, "{}", n1.agent_log());
    }
    // No EndpointSlice API at all.
    let cluster = cluster();
    let stub = ApiStub::from_fixture();
    stub.serve_slices_as("");
    let n1 = &cluster.nodes[0];
    let listener = n1
        .netns
        .run(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .expect("a loopback listener in the node");
    let served = ServedStub::serve(stub.clone(), listener);
    n1.start_agent(&Peers::Api(served.url.clone()));
    let marker = n1.ready_marker();
    wait_until("the agent to say NetworkPolicy is down", SETTLE, || {
        std::fs::read_to_string(&marker).is_ok_and(|m| m.contains("\"down\""))
    });
    let said = std::fs::read_to_string(&marker).unwrap();
    assert!(
        said.contains("NetworkPolicy is not enforced on this node: EndpointSlice (discovery.k8s.io/v1) cannot be listed"),
        "{said}"
    );
    let page = n1.agent_http("/readyz");
    assert!(page.starts_with("HTTP/1.0 503"), "{page}");
    assert!(page.contains("NetworkPolicy is not enforced"), "{page}");
    let metrics = n1.metrics();
    assert!(metrics.contains(policy_down), "{metrics}");
    assert!(metrics.contains("flatnet_agent_ready 0"), "{metrics}");
    let mut conf = Conflist::new(n1.conflist()).first_plugin_conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["agentManaged"] = json!(true);
    let status = CniCall {
        command: "STATUS".into(),
        path: n1.bin_dir().display().to_string(),
        node: Some(n1.netns.path()),
        ..CniCall::default()
    }
    .run(&n1.bin_dir().join("flatnet"), conf.to_string().as_bytes());
    status.assert_error(50, "NetworkPolicy is not enforced on this node");
    // Never silently open: a new pod of a namespace without policies (none
    // could be listed) starts isolated both ways.
    let pod = n1.pod_in(Netns::new(), &kubelet_args("y", "b"));
    assert_eq!(
        policy_flags(n1, pod.ip),
        flatnet_common::POLICY_F_INGRESS | flatnet_common::POLICY_F_EGRESS
    );
}

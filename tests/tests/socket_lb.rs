//! Services at the socket: the datapath's cgroup programs, attached to a
//! cgroup v2 of the test's own (the agent attaches them to the node's root
//! cgroup), rewrite a ClusterIP to a backend at connect() and sendmsg() and
//! show the ClusterIP back at getpeername() and recvmsg(). The client is a
//! process of its own (`flatnet-sock-client`) in that cgroup and in a pod's
//! namespace; the backends are pods of the same network. The frontends are
//! written through the Datapath API, as the agent writes them.
//!
//! Each client pod gets a blackhole route for the Service CIDRs: a packet
//! to a ClusterIP that no program rewrote dies in the pod instead of
//! leaving by the node's default route.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flatnet::datapath::{service_backend, service_key};
use flatnet_tests::*;
use serde_json::Value;

const TCP: u8 = 6;
const UDP: u8 = 17;
const BACKEND_PORT: u16 = 8080;

/// A cgroup v2 directory of the test's own, removed on drop (its client
/// processes have exited by then).
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn new() -> Self {
        let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
        let root = mounts
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
            })
            .expect("a cgroup v2 mount (CONFIG_CGROUP_BPF needs one)");
        let dir = root.join(unique("flatnet-test-"));
        std::fs::create_dir(&dir).expect("creating the test cgroup");
        TestCgroup(dir)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.0) {
            eprintln!("removing {}: {e}", self.0.display());
        }
    }
}

/// Servers in a pod answering each TCP connection (after reading it to its
/// end) and each UDP datagram with `name`; stopped on drop.
struct Backend {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Backend {
    fn start(pod: &Pod, name: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let bind = SocketAddr::from((Ipv6Addr::UNSPECIFIED, BACKEND_PORT));
        let (tcp, udp) = pod.netns.run(|| {
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
                        Ok((mut conn, _)) => {
                            conn.set_nonblocking(false).unwrap();
                            conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                            let mut request = Vec::new();
                            let _ = conn.read_to_end(&mut request);
                            let _ = conn.write_all(name.as_bytes());
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
                    if let Ok((_, from)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(name.as_bytes(), from);
                    }
                }
            })
        };
        Backend {
            stop,
            threads: vec![tcp_thread, udp_thread],
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What one client process saw: Ok((answer, peer)) or Err((error, errno)).
type Seen = Result<(String, SocketAddr), (String, Option<i64>)>;

fn client(cgroup: &Path, pod: &Pod, protocol: &str, to: SocketAddr) -> Seen {
    let out = Command::new(env!("CARGO_BIN_EXE_flatnet-sock-client"))
        .arg(cgroup)
        .arg(pod.netns.path())
        .args([protocol, &to.to_string(), "request"])
        .output()
        .expect("running flatnet-sock-client");
    assert!(out.status.success(), "flatnet-sock-client: {out:?}");
    let line: Value = serde_json::from_slice(&out.stdout).expect("its JSON line");
    match line["answer"].as_str() {
        Some(answer) => Ok((
            answer.to_string(),
            line["peer"].as_str().unwrap().parse().expect("peer"),
        )),
        None => Err((line["error"].to_string(), line["errno"].as_i64())),
    }
}

/// Service addresses a client pod must never send to unrewritten.
fn blackhole_services(pod: &Pod) {
    for (family, cidr) in [("-4", "10.96.0.0/16"), ("-6", "fd96::/108")] {
        pod.netns
            .exec(&["ip", family, "route", "add", "blackhole", cidr]);
    }
}

#[test]
fn cluster_ips_are_rewritten_to_backends_at_the_socket() {
    if !root_or_skip("cluster_ips_are_rewritten_to_backends_at_the_socket") {
        return;
    }
    let net = Network::dual_stack("tc");
    let client_pod = net.pod();
    blackhole_services(&client_pod);
    let pods: Vec<Pod> = (0..3).map(|_| net.pod()).collect();
    let names = ["b0", "b1", "b2"];
    let _backends: Vec<Backend> = pods
        .iter()
        .zip(names)
        .map(|(pod, name)| Backend::start(pod, name))
        .collect();
    let datapath = net.datapath();
    let cgroup = TestCgroup::new();
    datapath
        .attach_services(&cgroup.0)
        .expect("attaching the socket programs");
    assert!(datapath.services_attached());

    for v6 in [false, true] {
        let cluster_ip: IpAddr = if v6 {
            "fd96::7".parse().unwrap()
        } else {
            Ipv4Addr::new(10, 96, 7, 1).into()
        };
        let frontend = SocketAddr::new(cluster_ip, 80);
        let backend_of = |pod: &Pod| SocketAddr::new(pod.address(v6), BACKEND_PORT);
        let all: Vec<_> = pods
            .iter()
            .map(|p| service_backend(backend_of(p)))
            .collect();
        let tcp_key = service_key(cluster_ip, 80, TCP);
        datapath.put_service(&tcp_key, 1, &all, 0).unwrap();

        // Three backends: every connection reaches one, all are used, and
        // the application sees the ClusterIP as its peer.
        let mut seen = BTreeSet::new();
        for _ in 0..30 {
            let (answer, peer) = client(&cgroup.0, &client_pod, "tcp", frontend)
                .unwrap_or_else(|e| panic!("v6 {v6}: connect to {frontend}: {e:?}"));
            assert_eq!(peer, frontend, "getpeername() showed the backend");
            seen.insert(answer);
        }
        assert_eq!(seen, BTreeSet::from(names.map(String::from)), "v6 {v6}");

        // The set replaced by one backend: every new connection goes there,
        // and the old set is gone from the map.
        datapath
            .put_service(&tcp_key, 2, &[service_backend(backend_of(&pods[1]))], 0)
            .unwrap();
        for _ in 0..10 {
            let (answer, _) = client(&cgroup.0, &client_pod, "tcp", frontend).unwrap();
            assert_eq!(
                answer, "b1",
                "v6 {v6}: a new connection to a removed backend"
            );
        }
        assert_eq!(
            datapath.service_backends(&tcp_key).unwrap().unwrap().len(),
            1
        );

        // No endpoint: connect() is refused, as kube-proxy's REJECT does.
        datapath.put_service(&tcp_key, 3, &[], 0).unwrap();
        let refused = client(&cgroup.0, &client_pod, "tcp", frontend);
        assert_eq!(
            refused.as_ref().err().and_then(|(_, errno)| *errno),
            Some(111),
            "v6 {v6}: {refused:?}"
        );
        datapath.delete_service(&tcp_key).unwrap();

        // UDP, DNS-like: the answer's source is the ClusterIP and port the
        // client sent to (recvmsg rewritten), as a resolver checks.
        let dns = SocketAddr::new(cluster_ip, 53);
        let udp_key = service_key(cluster_ip, 53, UDP);
        datapath
            .put_service(&udp_key, 4, &[service_backend(backend_of(&pods[2]))], 0)
            .unwrap();
        let (answer, from) = client(&cgroup.0, &client_pod, "udp", dns)
            .unwrap_or_else(|e| panic!("v6 {v6}: UDP to {dns}: {e:?}"));
        assert_eq!((answer.as_str(), from), ("b2", dns), "v6 {v6}");
        datapath.delete_service(&udp_key).unwrap();
        assert!(datapath.service_frontends().unwrap().is_empty());
    }

    // Pod to pod straight: untouched.
    let direct = SocketAddr::new(pods[0].address(false), BACKEND_PORT);
    let (answer, peer) = client(&cgroup.0, &client_pod, "tcp", direct).unwrap();
    assert_eq!((answer.as_str(), peer), ("b0", direct));

    datapath.detach_services().unwrap();
    assert!(!datapath.services_attached());
}

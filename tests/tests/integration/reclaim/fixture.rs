//! The reclaim tests' node: a simulated node running the real agent with
//! `--cri-socket` beside a real containerd, the grace period and resync
//! interval they use, a sandbox's address, and a TCP exchange between two
//! sandboxes.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flatnet_tests::cluster::{Cluster, SimNode};
use flatnet_tests::containerd::{Containerd, TOOLS, TestImages};
use flatnet_tests::cri::CriClient;
use flatnet_tests::kube_stub::metric;
use flatnet_tests::*;

/// containerd, runc, busybox and the loopback plugin.
pub(super) fn reclaim_tools() -> Vec<(String, &'static str)> {
    TOOLS
        .iter()
        .map(|(tool, package)| (tool.to_string(), *package))
        .chain(reference_plugins(&["loopback"]))
        .collect()
}

/// The agent's grace period and resync interval in these tests. The grace
/// must outlast a RunPodSandbox from its CNI ADD to the sandbox being
/// listed, as the agent's default (60 s) does by far: under CI's load a
/// 2 s grace once reclaimed a live sandbox still being started.
pub(super) const GRACE_SECS: f64 = 4.0;

pub(super) const RESYNC_SECS: f64 = 0.05;

/// One node with its agent (reclaim on) and containerd. containerd goes
/// first on drop: its sandboxes get their DELs while the node still exists.
pub(super) struct CriNode {
    pub(super) containerd: Containerd,
    cluster: Cluster,
}

impl CriNode {
    pub(super) fn start(grace_secs: f64) -> Self {
        TestImages::set_cache_dir(Path::new(env!("CARGO_TARGET_TMPDIR")));
        let specs = Cluster::numbered(1, false);
        let mut cluster = Cluster::new(&specs);
        let socket_link = cluster.nodes[0].dir.join("cri.sock");
        cluster.nodes[0].agent_flags = vec![
            "--cri-socket".into(),
            socket_link.display().to_string(),
            "--reclaim-grace-secs".into(),
            grace_secs.to_string(),
            "--resync-secs".into(),
            RESYNC_SECS.to_string(),
        ];
        cluster.write_peers(&specs);
        let node = &cluster.nodes[0];
        node.start_agent(&cluster.file());
        // The conflist and the plugins containerd's CRI runs (loopback for
        // every sandbox, portmap and bandwidth) are the agent's to install.
        node.wait_ready();
        assert!(
            node.bin_dir().join("loopback").exists(),
            "the agent installs the loopback plugin containerd's CRI runs"
        );
        let containerd = Containerd::start_in(
            Some(&node.netns.path()),
            &node.dir.join("conf"),
            &node.bin_dir(),
        )
        .unwrap_or_else(|e| panic!("containerd: {e:#}"));
        // Until now the agent's passes found no runtime and released nothing.
        std::os::unix::fs::symlink(containerd.socket(), &socket_link).expect("socket link");
        CriNode {
            containerd,
            cluster,
        }
    }

    pub(super) fn node(&self) -> &SimNode {
        &self.cluster.nodes[0]
    }

    pub(super) fn client(&self) -> CriClient {
        self.containerd
            .client()
            .unwrap_or_else(|e| panic!("CRI client: {e:#}"))
    }

    /// The addresses flatnet-ipam holds for the node's network.
    pub(super) fn allocations(&self) -> Vec<IpAddr> {
        let dir = self.node().dir.join("ipam").join(&self.node().network);
        let mut held: Vec<IpAddr> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        held.sort();
        held
    }

    pub(super) fn has_endpoint(&self, ip: IpAddr) -> bool {
        self.node()
            .datapath()
            .all_endpoints()
            .expect("ENDPOINTS")
            .iter()
            .any(|(address, _)| *address == ip)
    }

    /// A counter or gauge of the agent's metrics page (0 when absent).
    /// `flatnet_ipam_reclaimed_total` reaches `count` and stays there: it
    /// is counted when the agent's pass ends, a moment after its DEL
    /// released the address and the endpoint (CI read 0 in between).
    pub(super) fn assert_reclaimed(&self, count: u64) {
        wait_until("the reclaim to be counted", Duration::from_secs(5), || {
            self.metric("flatnet_ipam_reclaimed_total") >= count
        });
        assert_eq!(
            self.metric("flatnet_ipam_reclaimed_total"),
            count,
            "{}",
            self.node().agent_log()
        );
    }

    pub(super) fn metric(&self, name: &str) -> u64 {
        metric(&self.node().metrics(), name).map_or(0, |v| v as u64)
    }

    pub(super) fn passes(&self) -> u64 {
        self.metric("flatnet_ipam_reclaim_passes_total")
    }

    /// Asked of the kernel by name in the node's netns (/sys/class/net
    /// shows the test's own namespace whatever thread looks).
    pub(super) fn link_in_node(&self, name: &str) -> bool {
        std::process::Command::new("ip")
            .args(["-n", &self.node().netns.name, "link", "show", "dev", name])
            .output()
            .expect("ip link show")
            .status
            .success()
    }

    /// Waits until the agent has made `more` passes from now.
    pub(super) fn wait_passes(&self, more: u64) {
        let target = self.passes() + more;
        wait_until(
            &format!("{more} more reclaim passes"),
            Duration::from_secs(60),
            || self.passes() >= target,
        );
    }

    /// Waits for `ip` to be released; how long it took from `since`.
    pub(super) fn wait_released(&self, ip: IpAddr, since: Instant) -> Duration {
        let released = poll_until(
            Duration::from_secs_f64(GRACE_SECS * 10.0),
            Duration::from_millis(20),
            || !self.allocations().contains(&ip),
        );
        assert!(
            released,
            "{ip} was never reclaimed; allocations {:?}\nagent log:\n{}",
            self.allocations(),
            self.node().agent_log()
        );
        since.elapsed()
    }
}

/// The sandbox's IPv4 address (PodSandboxStatus) and its netns path.
pub(super) fn sandbox_address(client: &CriClient, id: &str) -> (Ipv4Addr, PathBuf) {
    let status = client.pod_sandbox_status(id).expect("PodSandboxStatus");
    (
        status.ip.parse().expect("an IPv4 sandbox address"),
        status.netns.expect("the sandbox's netns"),
    )
}

/// A TCP exchange from the netns at `from` to a listener in the netns at
/// `to` on `address`: the listener answers with what it read, reversed.
pub(super) fn talk(from: &Path, to: &Path, address: Ipv4Addr) {
    let (to, from) = (to.to_path_buf(), from.to_path_buf());
    let listener = std::thread::spawn(move || {
        enter_thread(&to).expect("enter the server's netns");
        let listener = TcpListener::bind((address, 7070)).expect("listen");
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 32];
        let n = conn.read(&mut buf).expect("read");
        buf[..n].reverse();
        conn.write_all(&buf[..n]).expect("write");
    });
    let answer = std::thread::spawn(move || {
        enter_thread(&from).expect("enter the client's netns");
        let mut conn = None;
        poll_until(Duration::from_secs(5), Duration::from_millis(20), || {
            conn = TcpStream::connect((address, 7070)).ok();
            conn.is_some()
        });
        let mut conn = conn.expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"reclaim").expect("send");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).expect("answer");
        answer
    })
    .join()
    .expect("client");
    listener.join().expect("server");
    assert_eq!(answer, "mialcer");
}

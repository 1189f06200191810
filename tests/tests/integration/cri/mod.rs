//! flatnet as a Kubernetes node runs it: kubelet never calls a CNI plugin;
//! it asks containerd over CRI, and containerd's CRI plugin runs the node's
//! conflist through libcni. Here a real containerd 1.6 ([`Containerd`],
//! its own root, state and socket) stands for the node's runtime, the
//! [`CriClient`] for kubelet (RunPodSandbox, PodSandboxStatus,
//! CreateContainer, ExecSync, StopPodSandbox, RemovePodSandbox), and the
//! conflist is the one the node agent writes (`render_conflist`): flatnet
//! with flatnet-ipam, the reference bandwidth plugin chained.
//!
//! A [`Node::simulated`] node runs its containerd (and so every plugin,
//! the pods' host veths, routes, qdiscs and portmap's iptables rules) in a
//! network namespace of its own, with an address on a veth into another
//! namespace (`outside`), and chains portmap as well, as the agent's
//! conflist does: hostPort and the bandwidth annotations, end to end.
//!
//! Each test has its own network name, gateway device, pin root, pod CIDR
//! and IPAM dir, so tests run in parallel; everything, containerd's
//! processes and mounts included, is removed on drop, also on failure.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use flatnet_agent::install::{ConflistSpec, render_conflist};
use flatnet_common::{ENDPOINT_F_SHAPED_INGRESS, SOURCES_F_SHAPED_EGRESS, action};
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::containerd::{BUSYBOX_IMAGE, Containerd, TOOLS, TestImages};
use flatnet_tests::cri::{CriClient, PodSpec, SandboxStatus};
use flatnet_tests::*;
use k8s_cri::v1::{PodSandboxState, PortMapping, Protocol};
use serde_json::{Value, json};

mod bandwidth;
mod bench;
mod host_ports;
mod sandboxes;

/// The reference plugins the bin dir holds next to flatnet's: loopback
/// (containerd's CRI sets up every sandbox's lo with it), the chained
/// ones, and the baseline network of the benchmark.
const REFERENCE: &[&str] = &["loopback", "portmap", "bandwidth", "host-local", "bridge"];

/// containerd, runc, busybox and the reference plugins.
fn cri_tools() -> Vec<(String, &'static str)> {
    TOOLS
        .iter()
        .map(|(tool, package)| (tool.to_string(), *package))
        .chain(reference_plugins(REFERENCE))
        .collect()
}

fn next_subnet() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One node: the CNI dirs containerd reads, the agent's conflist for a
/// network of the test's own, and containerd itself.
struct Node {
    network: String,
    bridge: String,
    pin_root: PathBuf,
    ipam_dir: PathBuf,
    dir: PathBuf,
    /// "10.x.y" of the node's IPv4 pod CIDR.
    prefix: String,
    containerd: Option<Containerd>,
    /// The baseline network of the benchmark (bridge device, host-local dir).
    baseline: Option<(String, PathBuf)>,
    /// This node's number in the process: its subnets and host ports.
    index: u32,
    /// A simulated node's own network namespace; None: the test process's.
    /// Dropped after containerd (whose drop runs CNI DEL in it).
    ns: Option<NodeNs>,
}

/// The network namespace of a simulated node: containerd runs in it, so
/// the plugins make the pods' host side there, and portmap and bandwidth
/// write their rules and qdiscs there, never in the test process's.
struct NodeNs {
    netns: Netns,
    /// At the other end of the node's `up0`: the rest of the cluster, a
    /// client from outside the node.
    outside: Netns,
    /// The node's address (on `up0`, /24), what a hostPort is reached at.
    address: Ipv4Addr,
}

impl NodeNs {
    fn new(index: u32) -> Self {
        let netns = Netns::new();
        let outside = Netns::new();
        let subnet = format!("172.31.{}", index % 250);
        run_ok(Command::new("ip").args([
            "-n",
            &netns.name,
            "link",
            "add",
            "up0",
            "type",
            "veth",
            "peer",
            "name",
            "up0",
            "netns",
            &outside.name,
        ]));
        for (ns, host) in [(&netns, 1), (&outside, 2)] {
            ns.exec(&[
                "ip",
                "addr",
                "add",
                &format!("{subnet}.{host}/24"),
                "dev",
                "up0",
            ]);
            ns.exec(&["ip", "link", "set", "up0", "up"]);
        }
        // A fresh node: flatnet's ADD turns forwarding on, which hostPort
        // and shaped traffic need (the node's stack forwards them).
        forwarding::off_in(&netns);
        // containerd's stream server binds 127.0.0.1 there.
        let lo = netns.exec(&["ip", "-o", "link", "show", "dev", "lo"]);
        assert!(lo.contains(",UP"), "loopback of the node is down: {lo}");
        NodeNs {
            address: format!("{subnet}.1").parse().expect("the node's address"),
            netns,
            outside,
        }
    }
}

impl Node {
    /// A node in the test process's own network namespace; portmap is left
    /// out of its conflist (its nat chains would stay on the machine).
    fn new(dual_stack: bool) -> Self {
        Self::build(dual_stack, false)
    }

    /// A simulated node (its own network namespace, see [`NodeNs`]) with
    /// the agent's conflist as a node gets it: portmap and bandwidth
    /// chained after flatnet.
    fn simulated() -> Self {
        Self::build(false, true)
    }

    fn build(dual_stack: bool, own_netns: bool) -> Self {
        TestImages::set_cache_dir(Path::new(env!("CARGO_TARGET_TMPDIR")));
        let n = next_subnet();
        let prefix = format!("10.{}.{}", 200 + std::process::id() % 50, n % 250);
        let network = unique("ft-cri-");
        let dir = std::env::temp_dir().join(unique("flatnet-cri-node-"));
        let mut node = Node {
            bridge: unique("flc"),
            pin_root: PathBuf::from("/sys/fs/bpf").join(unique("flatnet-cri-")),
            ipam_dir: dir.join("ipam"),
            dir,
            network,
            prefix,
            containerd: None,
            baseline: None,
            index: n,
            ns: own_netns.then(|| NodeNs::new(n)),
        };
        for sub in ["conf", "bin"] {
            std::fs::create_dir_all(node.dir.join(sub)).expect("node dirs");
        }
        for plugin in ["flatnet", "flatnet-ipam"] {
            std::os::unix::fs::symlink(bin(plugin), node.dir.join("bin").join(plugin))
                .expect("plugin link");
        }
        for plugin in REFERENCE {
            std::os::unix::fs::symlink(
                Path::new(REFERENCE_PLUGINS).join(plugin),
                node.dir.join("bin").join(plugin),
            )
            .expect("reference plugin link");
        }
        let mut cidrs = vec![format!("{}.0/24", node.prefix).parse().expect("CIDR")];
        if dual_stack {
            let octets: Vec<&str> = node.prefix.split('.').collect();
            cidrs.push(
                format!("fd43:{}:{}::/64", octets[1], octets[2])
                    .parse()
                    .expect("CIDR"),
            );
        }
        let spec = ConflistSpec {
            network: node.network.clone(),
            bridge: node.bridge.clone(),
            datapath: flatnet::config::DatapathMode::Tc,
            mtu: None,
            ip_masq: false,
            ipam_data_dir: Some(node.ipam_dir.clone()),
            pin_root: node.pin_root.clone(),
            // portmap would leave its nat chains on the machine: only
            // where they stay in the node's own namespace.
            portmap: own_netns,
            host_ports_in_bpf: false,
            bandwidth: true,
            big_tcp: None,
            // containerd 1.6's libcni reads cniVersion alone.
            cni_versions: vec!["1.0.0", "1.1.0"],
        };
        let list = render_conflist(&spec, &cidrs).expect("the agent's conflist");
        node.write_conf("10-flatnet.conflist", &list);
        let netns = node.ns.as_ref().map(|ns| ns.netns.path());
        let containerd =
            Containerd::start_in(netns.as_deref(), &node.conf_dir(), &node.dir.join("bin"))
                .unwrap_or_else(|e| panic!("containerd: {e:#}"));
        node.containerd = Some(containerd);
        node
    }

    fn conf_dir(&self) -> PathBuf {
        self.dir.join("conf")
    }

    fn write_conf(&self, name: &str, list: &Value) {
        std::fs::write(
            self.conf_dir().join(name),
            serde_json::to_vec_pretty(list).expect("JSON"),
        )
        .expect("write the conflist");
    }

    fn containerd(&self) -> &Containerd {
        self.containerd.as_ref().expect("containerd")
    }

    fn client(&self) -> CriClient {
        self.containerd()
            .client()
            .unwrap_or_else(|e| panic!("CRI client: {e:#}"))
    }

    fn datapath(&self) -> Datapath {
        Datapath::with_root(&self.pin_root, &self.network)
    }

    fn redirected_bytes(&self) -> u64 {
        self.datapath().stats().expect("STATS")[flatnet_common::action::REDIRECTED as usize].bytes
    }

    /// `ip` for the node's network namespace.
    fn ip(&self) -> Command {
        let mut cmd = Command::new("ip");
        if let Some(ns) = &self.ns {
            cmd.args(["-n", &ns.netns.name]);
        }
        cmd
    }

    /// `args` run in the node's network namespace; its stdout.
    fn exec(&self, args: &[&str]) -> String {
        match &self.ns {
            Some(ns) => ns.netns.exec(args),
            None => run_ok(Command::new(args[0]).args(&args[1..])),
        }
    }

    /// A link of the node's (host-side) namespace.
    fn has_link(&self, name: &str) -> bool {
        match &self.ns {
            Some(_) => self
                .ip()
                .args(["link", "show", "dev", name])
                .output()
                .is_ok_and(|out| out.status.success()),
            None => link_exists(name),
        }
    }

    fn wait_link_gone(&self, name: &str, timeout: Duration) -> bool {
        poll_until(timeout, POLL_INTERVAL, || !self.has_link(name))
    }

    fn host_veth(&self, sandbox_id: &str) -> String {
        // containerd's CRI calls CNI with the sandbox ID and eth0.
        AttachmentNames::new(&self.network, sandbox_id, "eth0").host_veth
    }

    /// Addresses flatnet-ipam holds for this network.
    fn allocations(&self) -> Vec<IpAddr> {
        let Ok(entries) = std::fs::read_dir(self.ipam_dir.join(&self.network)) else {
            return Vec::new();
        };
        let mut held: Vec<IpAddr> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        held.sort();
        held
    }

    /// RunPodSandbox, its status, and the checks every sandbox must pass:
    /// ready, on flatnet's host veth, its netns known.
    fn run_sandbox(&self, client: &CriClient, name: &str) -> Sandbox {
        self.run_pod(client, &PodSpec::new(name))
    }

    /// [`run_sandbox`](Self::run_sandbox) of a pod with port mappings or
    /// annotations.
    fn run_pod(&self, client: &CriClient, pod: &PodSpec) -> Sandbox {
        let id = client
            .run_pod_sandbox(pod)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()));
        self.sandbox(client, id)
    }

    fn sandbox(&self, client: &CriClient, id: String) -> Sandbox {
        let status = client
            .pod_sandbox_status(&id)
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(status.state, PodSandboxState::SandboxReady, "{status:?}");
        let netns = status
            .netns
            .clone()
            .unwrap_or_else(|| panic!("no netns in the verbose status of {id}: {status:?}"));
        self.containerd().note_netns(&netns);
        let host_veth = self.host_veth(&id);
        assert!(self.has_link(&host_veth), "host veth {host_veth} of {id}");
        Sandbox {
            id,
            status,
            netns,
            host_veth,
        }
    }

    /// Stop and Remove left nothing of `gone` (veth, endpoint entries,
    /// addresses), and with no sandbox left, no pins or gateway device.
    fn assert_cleaned_up(&self, gone: &[Sandbox], none_left: bool) {
        for sandbox in gone {
            assert!(
                self.wait_link_gone(&sandbox.host_veth, Duration::from_secs(10)),
                "host veth {} of {} left",
                sandbox.host_veth,
                sandbox.id
            );
            assert!(
                !sandbox.netns.exists(),
                "netns {} of {} left",
                sandbox.netns.display(),
                sandbox.id
            );
        }
        let held: HashSet<IpAddr> = self.allocations().into_iter().collect();
        for sandbox in gone {
            for ip in sandbox.ips() {
                assert!(
                    !held.contains(&ip),
                    "{ip} of {} still allocated",
                    sandbox.id
                );
                if self.datapath().exists() {
                    assert!(
                        self.datapath().endpoint(ip).expect("endpoint").is_none(),
                        "endpoint {ip} of {} left in the datapath",
                        sandbox.id
                    );
                }
            }
        }
        if none_left {
            assert!(held.is_empty(), "addresses left: {held:?}");
            assert!(
                !self.datapath().exists(),
                "pins left in {}",
                self.datapath().pin_dir().display()
            );
            assert!(
                self.wait_link_gone(&self.bridge, Duration::from_secs(10)),
                "gateway device {} left",
                self.bridge
            );
        }
    }

    /// A busybox httpd serving the container's / on :8080 in the sandbox.
    fn start_httpd(&self, client: &CriClient, sandbox: &Sandbox) -> String {
        client
            .create_and_start_container(
                &sandbox.id,
                "httpd",
                BUSYBOX_IMAGE,
                &["/bin/httpd", "-f", "-p", "8080", "-h", "/"],
            )
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // containerd first: its drop stops and removes the sandboxes (CNI DEL).
        drop(self.containerd.take());
        let mut devices = vec![self.bridge.clone()];
        devices.extend(self.baseline.iter().map(|(bridge, _)| bridge.clone()));
        for device in devices {
            let _ = self.ip().args(["link", "del", &device]).output();
        }
        let _ = self.datapath().remove_pins();
        let _ = std::fs::remove_dir_all(&self.pin_root);
        let _ = std::fs::remove_file(format!(
            "{}/{}.lock",
            flatnet_datapath::lock::LOCK_DIR,
            flatnet_datapath::lock::network(&self.network)
        ));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A sandbox as the tests know it.
struct Sandbox {
    id: String,
    status: SandboxStatus,
    netns: PathBuf,
    host_veth: String,
}

impl Sandbox {
    fn ip(&self) -> IpAddr {
        self.status.ip.parse().expect("the sandbox's IP")
    }

    fn ips(&self) -> Vec<IpAddr> {
        std::iter::once(&self.status.ip)
            .chain(&self.status.additional_ips)
            .map(|ip| ip.parse().expect("an IP"))
            .collect()
    }

    /// Global addresses on eth0 inside the sandbox's netns.
    fn addresses_inside(&self) -> Vec<IpAddr> {
        let mut cmd = Command::new("ip");
        cmd.args(["-o", "addr", "show", "dev", "eth0", "scope", "global"]);
        enter(&mut cmd, &self.netns).expect("enter the sandbox's netns");
        run_ok(&mut cmd)
            .lines()
            .filter_map(|line| line.split_whitespace().nth(3))
            .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
            .collect()
    }
}

/// Runs `f` on a thread in the network namespace at `netns`.
fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter_thread(netns).expect("enter the netns");
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// An HTTP GET of `path` from `server`, made from the current thread.
fn http_get(server: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let mut conn = TcpStream::connect_timeout(&server, Duration::from_secs(5))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response)?;
    Ok(response)
}

fn sha256_of(text: &[u8]) -> String {
    String::from_utf8_lossy(text)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// From a container, fetches /bin/busybox from `server`'s httpd and checks
/// its digest; ExecSync as `kubectl exec` runs it.
fn fetch_busybox(client: &CriClient, container: &str, server: IpAddr) {
    let want = sha256_of(run_ok(Command::new("sha256sum").arg("/bin/busybox")).as_bytes());
    let url = match server {
        IpAddr::V4(ip) => format!("http://{ip}:8080/bin/busybox"),
        IpAddr::V6(ip) => format!("http://[{ip}]:8080/bin/busybox"),
    };
    let (code, stdout, stderr) = client
        .exec_sync(
            container,
            &["sh", "-c", &format!("wget -q -O - {url} | sha256sum")],
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        code,
        0,
        "wget {url} in {container}: {}",
        String::from_utf8_lossy(&stderr)
    );
    assert_eq!(sha256_of(&stdout), want, "{container} fetched from {url}");
}

fn assert_no_sandboxes(client: &CriClient) {
    let left = client.list_pod_sandbox().expect("ListPodSandbox");
    assert!(left.is_empty(), "sandboxes left: {left:?}");
}

fn stop_and_remove(client: &CriClient, sandbox: &Sandbox) {
    client
        .stop_pod_sandbox(&sandbox.id)
        .unwrap_or_else(|e| panic!("{e:#}"));
    client
        .remove_pod_sandbox(&sandbox.id)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// The test process's netfilter rules (host namespace).
fn host_rules() -> String {
    format!(
        "{}{}",
        output(&mut Command::new("iptables-save")).unwrap_or_default(),
        output(Command::new("nft").args(["list", "ruleset"])).unwrap_or_default()
    )
}

/// Drops a simulated node and checks it took everything with it: its
/// namespaces, pins, and no rule of its network anywhere on the host.
fn assert_node_gone(node: Node) {
    let network = node.network.clone();
    let pin_root = node.pin_root.clone();
    let namespaces: Vec<PathBuf> = node
        .ns
        .as_ref()
        .map(|ns| vec![ns.netns.path(), ns.outside.path()])
        .unwrap_or_default();
    drop(node);
    for netns in namespaces {
        assert!(!netns.exists(), "{} left", netns.display());
    }
    assert!(!pin_root.exists(), "{} left", pin_root.display());
    let host = host_rules();
    assert!(
        !host.contains(&network),
        "{network} in the host's rules:\n{host}"
    );
}

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
            bandwidth: true,
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

#[flatnet_test(root, tools = cri_tools())]
fn sandbox_ip_in_cri_status_is_flatnets() {
    let node = Node::new(false);
    let client = node.client();
    let sandbox = node.run_sandbox(&client, "v4");
    let ip = sandbox.ip();
    assert!(ip.is_ipv4(), "{ip}");
    assert!(
        ip.to_string().starts_with(&format!("{}.", node.prefix)),
        "{ip} is not in the node's pod CIDR {}.0/24",
        node.prefix
    );
    assert!(
        sandbox.status.additional_ips.is_empty(),
        "{:?}",
        sandbox.status
    );
    assert_eq!(sandbox.addresses_inside(), vec![ip], "eth0 in the sandbox");
    assert_eq!(node.allocations(), vec![ip], "flatnet-ipam's store");
    assert!(
        node.datapath().endpoint(ip).expect("endpoint").is_some(),
        "no datapath endpoint for {ip}"
    );
    // The sandbox process is in that netns.
    let pid = sandbox.status.pid.expect("the sandbox's pid");
    let inode =
        |path: &Path| std::fs::metadata(path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    assert_eq!(
        inode(Path::new(&format!("/proc/{pid}/ns/net"))).expect("ns of the pid"),
        inode(&sandbox.netns).expect("netns file"),
        "the sandbox's pid is not in its netns"
    );

    stop_and_remove(&client, &sandbox);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[sandbox], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn dual_stack_sandbox_reports_both_families_ipv4_first() {
    let node = Node::new(true);
    let client = node.client();
    let sandbox = node.run_sandbox(&client, "dual");
    let ips = sandbox.ips();
    assert_eq!(ips.len(), 2, "{:?}", sandbox.status);
    assert!(ips[0].is_ipv4(), "the primary IP is IPv4: {ips:?}");
    assert!(ips[1].is_ipv6(), "the additional IP is IPv6: {ips:?}");
    let mut inside = sandbox.addresses_inside();
    inside.sort();
    let mut expected = ips.clone();
    expected.sort();
    assert_eq!(inside, expected, "eth0 in the sandbox");
    assert_eq!(node.allocations(), expected, "flatnet-ipam's store");
    for ip in &ips {
        assert!(
            node.datapath().endpoint(*ip).expect("endpoint").is_some(),
            "no datapath endpoint for {ip}"
        );
    }

    stop_and_remove(&client, &sandbox);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[sandbox], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn containers_in_two_sandboxes_talk_tcp_both_ways_through_the_redirect() {
    let node = Node::new(false);
    let client = node.client();
    let a = node.run_sandbox(&client, "a");
    let b = node.run_sandbox(&client, "b");
    let httpd_a = node.start_httpd(&client, &a);
    let httpd_b = node.start_httpd(&client, &b);
    let before = node.redirected_bytes();
    fetch_busybox(&client, &httpd_a, b.ip());
    fetch_busybox(&client, &httpd_b, a.ip());
    let redirected = node.redirected_bytes() - before;
    let file = std::fs::metadata("/bin/busybox").expect("busybox").len();
    eprintln!("{redirected} bytes redirected for two fetches of {file} bytes");
    assert!(
        redirected > 3 * file / 2,
        "only {redirected} bytes went through the redirect"
    );

    // Stop, then Remove, one at a time: the first leaves the network up.
    stop_and_remove(&client, &a);
    node.assert_cleaned_up(std::slice::from_ref(&a), false);
    assert!(node.datapath().exists(), "pins went with a pod still there");
    assert!(link_exists(&b.host_veth));
    stop_and_remove(&client, &b);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[a, b], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn stop_and_remove_leave_nothing_behind() {
    let node = Node::new(true);
    let client = node.client();
    let sandboxes: Vec<Sandbox> = (0..3)
        .map(|i| node.run_sandbox(&client, &format!("p{i}")))
        .collect();
    // A running container in the sandbox: Stop must take it down too.
    let _httpd = node.start_httpd(&client, &sandboxes[0]);
    assert_eq!(node.allocations().len(), 6, "two addresses per sandbox");
    // StopPodSandbox alone already tears the network down (CNI DEL);
    // RemovePodSandbox must not trip over that.
    client.stop_pod_sandbox(&sandboxes[0].id).expect("stop");
    assert!(
        wait_link_gone(&sandboxes[0].host_veth, Duration::from_secs(10)),
        "StopPodSandbox left the host veth"
    );
    assert_eq!(
        node.allocations().len(),
        4,
        "StopPodSandbox freed both addresses"
    );
    let stopped = client.pod_sandbox_status(&sandboxes[0].id).expect("status");
    assert_eq!(stopped.state, PodSandboxState::SandboxNotready);
    // A second Stop is a no-op for CNI (kubelet repeats it).
    client
        .stop_pod_sandbox(&sandboxes[0].id)
        .expect("stop again");
    for sandbox in &sandboxes {
        stop_and_remove(&client, sandbox);
    }
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&sandboxes, true);
}

#[flatnet_test(root, tools = cri_tools())]
fn sandboxes_survive_a_containerd_sigkill_and_restart() {
    let mut node = Node::new(false);
    let (a, b, httpd_a, httpd_b) = {
        let client = node.client();
        let a = node.run_sandbox(&client, "a");
        let b = node.run_sandbox(&client, "b");
        let httpd_a = node.start_httpd(&client, &a);
        let httpd_b = node.start_httpd(&client, &b);
        fetch_busybox(&client, &httpd_a, b.ip());
        (a, b, httpd_a, httpd_b)
    };
    node.containerd
        .as_mut()
        .expect("containerd")
        .kill_and_restart()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let client = node.client();
    for sandbox in [&a, &b] {
        let status = client.pod_sandbox_status(&sandbox.id).expect("status");
        assert_eq!(status.state, PodSandboxState::SandboxReady, "{status:?}");
        assert_eq!(status.ip, sandbox.status.ip, "the IP after the restart");
        assert!(link_exists(&sandbox.host_veth));
    }
    let before = node.redirected_bytes();
    fetch_busybox(&client, &httpd_a, b.ip());
    fetch_busybox(&client, &httpd_b, a.ip());
    assert!(
        node.redirected_bytes() - before
            > std::fs::metadata("/bin/busybox").expect("busybox").len(),
        "the traffic after the restart did not take the redirect"
    );
    assert_eq!(node.allocations().len(), 2);
    for sandbox in [&a, &b] {
        stop_and_remove(&client, sandbox);
    }
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[a, b], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn thirty_two_sandboxes_at_once_get_distinct_addresses_and_reach_each_other() {
    const PODS: usize = 32;
    let node = Node::new(false);
    let client = node.client();
    let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&format!("c{i}"))).collect();
    let started = Instant::now();
    let ids: Vec<String> = client
        .run_pod_sandboxes(&pods)
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e:#}\n{}", node.containerd().log_tail())))
        .collect();
    eprintln!("{PODS} concurrent RunPodSandbox in {:?}", started.elapsed());
    let sandboxes: Vec<Sandbox> = ids
        .into_iter()
        .map(|id| node.sandbox(&client, id))
        .collect();
    let ips: HashSet<IpAddr> = sandboxes.iter().map(Sandbox::ip).collect();
    assert_eq!(ips.len(), PODS, "addresses are not distinct");
    let mut held = node.allocations();
    held.sort();
    let mut expected: Vec<IpAddr> = ips.iter().copied().collect();
    expected.sort();
    assert_eq!(
        held, expected,
        "flatnet-ipam holds exactly the sandboxes' addresses"
    );
    assert_eq!(
        node.datapath().all_endpoints().expect("endpoints").len(),
        PODS
    );
    for sandbox in &sandboxes {
        assert_eq!(
            sandbox.addresses_inside(),
            vec![sandbox.ip()],
            "{}",
            sandbox.id
        );
    }

    // Every other sandbox fetches a file from the httpd in the first one
    // (from its netns), and the first one's container fetches from
    // listeners in a sample of the others.
    let server = &sandboxes[0];
    let httpd = node.start_httpd(&client, server);
    let server_addr = SocketAddr::new(server.ip(), 8080);
    wait_until("the httpd to listen", Duration::from_secs(10), || {
        in_netns(&sandboxes[1].netns, || {
            http_get(server_addr, "/etc/passwd").is_ok()
        })
    });
    let before = node.redirected_bytes();
    std::thread::scope(|scope| {
        for sandbox in &sandboxes[1..] {
            scope.spawn(move || {
                let response = in_netns(&sandbox.netns, || http_get(server_addr, "/etc/passwd"))
                    .unwrap_or_else(|e| panic!("{} to {server_addr}: {e}", sandbox.ip()));
                let text = String::from_utf8_lossy(&response);
                assert!(text.contains("root:x:0:0"), "{}: {text}", sandbox.ip());
            });
        }
    });
    for sandbox in sandboxes.iter().skip(1).step_by(7) {
        let listener = in_netns(&sandbox.netns, || {
            std::net::TcpListener::bind((sandbox.ip(), 9000)).expect("listen")
        });
        let accept = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut got = String::new();
            conn.read_to_string(&mut got).expect("read");
            got
        });
        let (code, _, stderr) = client
            .exec_sync(
                &httpd,
                &[
                    "sh",
                    "-c",
                    &format!("echo hello | nc {} 9000", sandbox.ip()),
                ],
                Duration::from_secs(10),
            )
            .expect("exec nc");
        assert_eq!(
            code,
            0,
            "nc to {}: {}",
            sandbox.ip(),
            String::from_utf8_lossy(&stderr)
        );
        assert_eq!(accept.join().expect("accept thread").trim(), "hello");
    }
    assert!(
        node.redirected_bytes() > before,
        "no traffic took the redirect"
    );

    let started = Instant::now();
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
    for (id, result) in ids.iter().zip(client.stop_and_remove_pod_sandboxes(&ids)) {
        result.unwrap_or_else(|e| panic!("{id}: {e:#}"));
    }
    eprintln!(
        "{PODS} concurrent Stop+RemovePodSandbox in {:?}",
        started.elapsed()
    );
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&sandboxes, true);
}

impl Node {
    fn node_ns(&self) -> &NodeNs {
        self.ns.as_ref().expect("a simulated node")
    }

    /// The node namespace's netfilter rules as iptables-nft and nft show
    /// them (portmap writes through iptables-nft).
    fn rules(&self) -> String {
        format!(
            "{}{}",
            self.exec(&["iptables-save"]),
            self.exec(&["nft", "list", "ruleset"])
        )
    }

    /// A busybox httpd on :8080 in the sandbox serving `/token`: `token`.
    fn start_token_httpd(&self, client: &CriClient, sandbox: &Sandbox, token: &str) -> String {
        let script =
            format!("mkdir -p /www && echo {token} > /www/token && exec httpd -f -p 8080 -h /www");
        let container = client
            .create_and_start_container(&sandbox.id, "web", BUSYBOX_IMAGE, &["sh", "-c", &script])
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()));
        let own = SocketAddr::new(sandbox.ip(), 8080);
        wait_until("the token httpd to listen", Duration::from_secs(10), || {
            in_netns(&sandbox.netns, || http_get(own, "/token")).is_ok()
        });
        container
    }
}

/// The test process's netfilter rules (host namespace).
fn host_rules() -> String {
    format!(
        "{}{}",
        output(&mut Command::new("iptables-save")).unwrap_or_default(),
        output(Command::new("nft").args(["list", "ruleset"])).unwrap_or_default()
    )
}

/// The body of an HTTP/1.0 response.
fn body(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.trim().to_string())
        .unwrap_or_else(|| format!("<no body in {text:?}>"))
}

#[flatnet_test(root, tools = cri_tools())]
fn host_port_reaches_the_pod_from_the_node_other_pods_and_outside() {
    let node = Node::simulated();
    let ns = node.node_ns();
    let client = node.client();
    let host_port = 30000 + (node.index % 2000) as u16;
    let mut web_pod = PodSpec::new("web");
    web_pod.port_mappings = vec![PortMapping {
        protocol: Protocol::Tcp as i32,
        container_port: 8080,
        host_port: i32::from(host_port),
        host_ip: String::new(),
    }];
    let web = node.run_pod(&client, &web_pod);
    // The other pod serves a token of its own on the same container port:
    // a hostPort that reached the wrong pod would show it.
    let other = node.run_sandbox(&client, "other");
    let (web_token, other_token) = (unique("web-token-"), unique("other-token-"));
    node.start_token_httpd(&client, &web, &web_token);
    let other_httpd = node.start_token_httpd(&client, &other, &other_token);

    // portmap's rules are in the node's namespace, none in the test process's.
    let rules = node.rules();
    assert!(
        rules.contains(&web.id) && rules.contains(&format!("--dport {host_port}")),
        "no portmap rule for {} in the node:\n{rules}",
        web.id
    );
    let host = host_rules();
    for ours in [&web.id, &node.network] {
        assert!(
            !host.contains(ours.as_str()),
            "{ours} in the host's rules:\n{host}"
        );
    }

    let target = SocketAddr::from((ns.address, host_port));
    let fetch = |netns: &Path, to: SocketAddr| -> String {
        in_netns(netns, || http_get(to, "/token"))
            .map(|response| body(&response))
            .unwrap_or_else(|e| panic!("GET {to}/token from {}: {e}", netns.display()))
    };
    // From the node itself: its address, and loopback (portmap's snat).
    let localhost = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port));
    for to in [target, localhost] {
        assert_eq!(fetch(&ns.netns.path(), to), web_token, "node -> {to}");
    }
    // From outside the node (another node, a load balancer).
    assert_eq!(
        fetch(&ns.outside.path(), target),
        web_token,
        "outside -> {target}"
    );
    // From another pod on the node: the test process in its netns, and its
    // container (ExecSync). portmap's hairpin rule masquerades sources in
    // the pod CIDR, so the reply goes to the node's address via the stack.
    assert_eq!(fetch(&other.netns, target), web_token, "pod -> {target}");
    let (code, stdout, stderr) = client
        .exec_sync(
            &other_httpd,
            &["wget", "-q", "-O", "-", &format!("http://{target}/token")],
            Duration::from_secs(10),
        )
        .expect("exec wget");
    assert_eq!(
        code,
        0,
        "wget {target}: {}",
        String::from_utf8_lossy(&stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&stdout).trim(),
        web_token,
        "container -> {target}"
    );

    stop_and_remove(&client, &web);
    node.assert_cleaned_up(std::slice::from_ref(&web), false);
    // Refused: nothing listens on the node's port, and no rule leads on.
    for from in [ns.netns.path(), other.netns.clone(), ns.outside.path()] {
        let answer = in_netns(&from, || http_get(target, "/token"));
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
            "{target} from {} after the pod went: {answer:?}",
            from.display()
        );
    }
    let rules = node.rules();
    assert!(
        !rules.contains(&web.id) && !rules.contains(&format!("--dport {host_port}")),
        "portmap's rules for {} left in the node:\n{rules}",
        web.id
    );
    // The other pod is still served.
    assert_eq!(
        fetch(&ns.netns.path(), SocketAddr::new(other.ip(), 8080)),
        other_token
    );
    stop_and_remove(&client, &other);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[web, other], true);
    assert_node_gone(node);
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

/// What a receiver saw of a TCP stream through a token bucket: the bytes
/// (and time) it got at full speed before the bucket ran dry, and the rate
/// it got after that.
#[derive(Debug)]
struct Shaped {
    /// Bytes received before the stream slowed down.
    burst_bytes: usize,
    burst_time: Duration,
    /// How long `WINDOW` bytes took once slowed, and the rate that makes.
    window: Duration,
    mbit_per_s: f64,
}

/// What [`stream_rate`] measured: a stream that slowed down to a rate, or
/// one that never did (all `MAX_BYTES`, or what `STREAM_TIME_LIMIT` let
/// through, received in this time).
#[derive(Debug)]
enum Stream {
    Shaped(Shaped),
    Unshaped { bytes: usize, took: Duration },
}

impl Stream {
    fn mbit_per_s(&self) -> f64 {
        match self {
            Stream::Shaped(shaped) => shaped.mbit_per_s,
            Stream::Unshaped { bytes, took } => *bytes as f64 * 8.0 / took.as_secs_f64() / 1e6,
        }
    }
}

/// The stream is measured over this many bytes once it slowed down: 4 s at
/// 4 Mbit/s. Tokens the bucket saved up during a stall just before the
/// window starts (a retransmission timeout after the switch) arrive at full
/// speed inside it; seen up to ~0.45 MB, which made a 1 MB window read
/// 7.3 Mbit/s on a 4 Mbit/s tbf. Over 2 MB the same tokens stay within the
/// bounds the test accepts.
const WINDOW: usize = 2_000_000;
/// And only after this many more.
const SETTLE: usize = 500_000;
/// Slowed down: less than this many bytes in the last `SLOW_SPAN`
/// (40 Mbit/s; a 4 Mbit/s tbf lets 125 kB through in that time, the
/// redirect hundreds of MB).
const SLOW_BYTES: usize = 1_250_000;
const SLOW_SPAN: Duration = Duration::from_millis(250);
/// The most a stream sends: containerd asks the bandwidth plugin for a
/// burst of u32::MAX bits, and the plugin's tbf lets ~120 MB through at
/// full speed before the rate bites.
const MAX_BYTES: usize = 200_000_000;
/// A stream that neither slowed down nor ended by then is judged as is.
const STREAM_TIME_LIMIT: Duration = Duration::from_secs(20);

/// Streams up to `MAX_BYTES` over TCP from the network namespace `from` to
/// a receiver at `to` in `server`, which watches its own receive rate: when
/// the stream slows down (a token bucket ran dry) it times the next
/// `WINDOW` bytes, then hangs up. A window that turns out fast (a stall,
/// not a shaper) is forgotten and the watch goes on.
fn stream_rate(server: &Path, to: SocketAddr, from: &Path) -> Stream {
    let listener = in_netns(server, || std::net::TcpListener::bind(to)).expect("listen");
    let receiver = std::thread::spawn(move || -> std::io::Result<Stream> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        let started = Instant::now();
        // (when, bytes so far) after each read of the last SLOW_SPAN.
        let mut recent: std::collections::VecDeque<(Duration, usize)> = Default::default();
        let mut slowed: Option<(Duration, usize)> = None;
        // Once slowed, SETTLE bytes go by untimed: tokens the bucket saved
        // up while the stream stalled at the switch would count as rate.
        let mut settle_until: Option<usize> = None;
        let mut got = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = conn.read(&mut buf)?;
            let now = started.elapsed();
            if n == 0 || now > STREAM_TIME_LIMIT {
                return Ok(Stream::Unshaped {
                    bytes: got,
                    took: now,
                });
            }
            got += n;
            if let Some(limit) = settle_until {
                if got >= limit {
                    slowed = Some((now, got));
                    settle_until = None;
                }
                continue;
            }
            if let Some((since, at)) = slowed {
                if got >= at + WINDOW {
                    let window = now - since;
                    let mbit_per_s = (got - at) as f64 * 8.0 / window.as_secs_f64() / 1e6;
                    if mbit_per_s < 40.0 {
                        // Hang up: the sender's next write fails.
                        return Ok(Stream::Shaped(Shaped {
                            burst_bytes: at,
                            burst_time: since,
                            window,
                            mbit_per_s,
                        }));
                    }
                    slowed = None;
                }
                continue;
            }
            recent.push_back((now, got));
            while recent
                .front()
                .is_some_and(|(when, _)| now - *when > SLOW_SPAN)
            {
                recent.pop_front();
            }
            let oldest = recent.front().map_or(0, |(_, bytes)| *bytes);
            let span_ago = got.saturating_sub(oldest);
            if now > SLOW_SPAN && got > WINDOW && span_ago < SLOW_BYTES {
                settle_until = Some(got + SETTLE);
                recent.clear();
            }
        }
    });
    let sent = in_netns(from, || -> std::io::Result<()> {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        let chunk = vec![0x5a; 256 * 1024];
        let mut left = MAX_BYTES;
        while left > 0 {
            let n = left.min(chunk.len());
            conn.write_all(&chunk[..n])?;
            left -= n;
        }
        conn.shutdown(std::net::Shutdown::Write)
    });
    // The receiver hangs up once it has its measure: the sender's next
    // write fails so.
    let hung_up = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        )
    };
    if let Err(e) = &sent
        && !hung_up(e)
    {
        // Unblock the receiver's accept so its thread ends.
        let _ = in_netns(server, || {
            TcpStream::connect_timeout(&to, Duration::from_secs(1))
        });
        let _ = receiver.join();
        panic!("sending to {to}: {e}");
    }
    receiver
        .join()
        .expect("receiver thread")
        .unwrap_or_else(|e| panic!("receiving at {to}: {e}"))
}

#[flatnet_test(root, tools = cri_tools())]
fn bandwidth_annotations_shape_pod_traffic_to_the_rate() {
    const RATE_MBIT: f64 = 4.0;
    let node = Node::simulated();
    let client = node.client();
    // What kubelet copies from the Pod's annotations into the sandbox
    // config; containerd's CRI turns them into runtimeConfig.bandwidth.
    let annotated = |name: &str, key: &str| {
        let mut pod = PodSpec::new(name);
        pod.annotations.insert(key.to_string(), "4M".to_string());
        pod
    };
    let ingress = node.run_pod(
        &client,
        &annotated("ingress", "kubernetes.io/ingress-bandwidth"),
    );
    let egress = node.run_pod(
        &client,
        &annotated("egress", "kubernetes.io/egress-bandwidth"),
    );
    let plain = node.run_sandbox(&client, "plain");
    let peer = node.run_sandbox(&client, "peer");

    // The bandwidth plugin's qdiscs, in the node's namespace.
    let tc = |dev: &str| node.exec(&["tc", "qdisc", "show", "dev", dev]);
    let ingress_qdiscs = tc(&ingress.host_veth);
    assert!(
        ingress_qdiscs.contains("tbf") && ingress_qdiscs.contains("rate 4Mbit"),
        "{ingress_qdiscs}"
    );
    let egress_qdiscs = tc(&egress.host_veth);
    assert!(egress_qdiscs.contains("qdisc ingress"), "{egress_qdiscs}");
    let ifbs: Vec<String> = node
        .exec(&["ip", "-o", "link", "show", "type", "ifb"])
        .lines()
        .filter_map(|l| Some(l.split(": ").nth(1)?.split('@').next()?.to_string()))
        .collect();
    assert_eq!(
        ifbs.len(),
        1,
        "one ifb device for the egress-shaped pod: {ifbs:?}"
    );
    let ifb_qdiscs = tc(&ifbs[0]);
    assert!(ifb_qdiscs.contains("rate 4Mbit"), "{ifb_qdiscs}");
    assert!(tc(&plain.host_veth).lines().all(|l| !l.contains("tbf")));
    eprintln!("ingress-shaped pod's veth: {ingress_qdiscs}egress-shaped pod's ifb: {ifb_qdiscs}");

    // Whether flatnet read the same runtimeConfig.bandwidth: judged after
    // the measurements, which show what it means.
    let datapath = node.datapath();
    let endpoint = |ip| {
        datapath
            .endpoint(ip)
            .expect("endpoint")
            .expect("an endpoint")
    };
    let sources = |ip| {
        datapath
            .sources(endpoint(ip).counter_slot)
            .expect("sources")
            .flags
    };
    let flatnet_knows = (
        endpoint(ingress.ip()).flags & ENDPOINT_F_SHAPED_INGRESS != 0,
        sources(egress.ip()) & SOURCES_F_SHAPED_EGRESS != 0,
        endpoint(plain.ip()).flags & ENDPOINT_F_SHAPED_INGRESS != 0
            || sources(plain.ip()) & SOURCES_F_SHAPED_EGRESS != 0,
    );

    let shaped_before = datapath.stats().expect("STATS")[action::SHAPED as usize].packets;
    let started = Instant::now();
    // Pod to pod: what flatnet's fast path must leave to the qdiscs.
    // The tbf's own byte counter: what went through the shaper.
    let tbf_sent = |dev: &str| -> u64 {
        let shown = node.exec(&["tc", "-s", "qdisc", "show", "dev", dev]);
        shown
            .lines()
            .skip_while(|l| !l.contains("qdisc tbf"))
            .find_map(|l| {
                l.trim()
                    .strip_prefix("Sent ")?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no tbf counters on {dev}: {shown}"))
    };
    // One shaped stream, to `server`'s port from `client`, whose shaper is
    // the tbf on `tbf_dev`.
    let shaped_stream = |what: &str, server: &Sandbox, client: &Sandbox, tbf_dev: &str| {
        let mut stream = Stream::Unshaped {
            bytes: 0,
            took: Duration::ZERO,
        };
        for attempt in 1..=2 {
            let tbf_before = tbf_sent(tbf_dev);
            let port = SocketAddr::new(server.ip(), 9000 + attempt);
            stream = stream_rate(&server.netns, port, &client.netns);
            let through_tbf = tbf_sent(tbf_dev) - tbf_before;
            let Stream::Unshaped { bytes, .. } = stream else {
                break;
            };
            // The fast path must not skip the shaper: every byte went
            // through the tbf.
            assert!(
                through_tbf >= bytes as u64,
                "{what}: {bytes} bytes received, only {through_tbf} through the tbf on \
                 {tbf_dev}: the datapath skipped the shaper"
            );
            // Seen about one run in four: the kernel's tbf, set up with the
            // burst containerd asks for (u32::MAX bits, which the bandwidth
            // plugin's buffer in ticks wraps), let a whole 200 MB stream
            // through unthrottled although all of it went through the tbf.
            // The next stream finds the bucket drained.
            eprintln!(
                "{what}, attempt {attempt}: the tbf let all {bytes} bytes through \
                 ({through_tbf} counted by it) before its rate bit; measuring again"
            );
        }
        stream
    };
    let into = shaped_stream(
        "into the ingress-shaped pod",
        &ingress,
        &peer,
        &ingress.host_veth,
    );
    let out_of = shaped_stream("from the egress-shaped pod", &peer, &egress, &ifbs[0]);
    let unshaped = stream_rate(&plain.netns, SocketAddr::new(plain.ip(), 9000), &peer.netns);
    eprintln!(
        "measured in {:?}: into the ingress-shaped pod {into:?}; from the egress-shaped pod \
         {out_of:?}; unshaped {unshaped:?}; flatnet's shaping flags (ingress pod, egress pod, \
         plain pod): {flatnet_knows:?}",
        started.elapsed()
    );
    assert!(
        flatnet_knows.0 && flatnet_knows.1 && !flatnet_knows.2,
        "flatnet did not record the shaping containerd asked for (ingress pod, egress pod, \
         plain pod: {flatnet_knows:?}); containerd sends runtimeConfig.bandwidth as \
         {{\"IngressRate\", \"IngressBurst\", \"EgressRate\", \"EgressBurst\"}} (go-cni's \
         field names), which the bandwidth plugin reads case-insensitively and flatnet \
         (plugin/src/cni/runtime.rs) only as ingressRate, ingressBurst, egressRate, egressBurst"
    );
    for (what, stream) in [
        ("into the ingress-shaped pod", &into),
        ("from the egress-shaped pod", &out_of),
    ] {
        let Stream::Shaped(shaped) = stream else {
            panic!("{what}: no shaping in {MAX_BYTES} bytes: {stream:?}");
        };
        eprintln!(
            "{what}: {:.1} MB at full speed in {:?}, then {WINDOW} bytes in {:?} ({:.2} Mbit/s)",
            shaped.burst_bytes as f64 / 1e6,
            shaped.burst_time,
            shaped.window,
            shaped.mbit_per_s
        );
        // 2 MB at 4 Mbit/s is 4 s: between 2.67 s and 8 s.
        assert!(
            shaped.mbit_per_s > RATE_MBIT * 0.5 && shaped.mbit_per_s < RATE_MBIT * 1.5,
            "{what}: {shaped:?}, not about {RATE_MBIT} Mbit/s"
        );
    }
    assert!(
        matches!(
            unshaped,
            Stream::Unshaped {
                bytes: MAX_BYTES,
                ..
            }
        ) && unshaped.mbit_per_s() > RATE_MBIT * 50.0,
        "the unshaped pod: {unshaped:?}"
    );
    assert!(
        datapath.stats().expect("STATS")[action::SHAPED as usize].packets > shaped_before,
        "the datapath did not hand shaped pods' packets to the stack"
    );

    let ifb = ifbs[0].clone();
    for sandbox in [&ingress, &egress, &plain, &peer] {
        stop_and_remove(&client, sandbox);
    }
    assert_no_sandboxes(&client);
    assert!(!node.has_link(&ifb), "the ifb device {ifb} was left");
    node.assert_cleaned_up(&[ingress, egress, plain, peer], true);
    assert_node_gone(node);
}

/// Median RunPodSandbox latency over `runs` sequential sandboxes (each
/// stopped and removed before the next, outside the timing), in ms.
fn median_run_latency(node: &Node, client: &CriClient, runs: usize, label: &str) -> f64 {
    let mut millis = Vec::with_capacity(runs);
    for i in 0..runs {
        let pod = PodSpec::new(&format!("{label}{i}"));
        let started = Instant::now();
        let id = client
            .run_pod_sandbox(&pod)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", node.containerd().log_tail()));
        millis.push(started.elapsed().as_secs_f64() * 1000.0);
        client.stop_pod_sandbox(&id).expect("stop");
        client.remove_pod_sandbox(&id).expect("remove");
    }
    millis.sort_by(f64::total_cmp);
    millis[runs / 2]
}

/// RunPodSandbox latency, flatnet against the reference bridge with
/// host-local, under one containerd: one JSON line on stdout. Not part of
/// the normal run (`cargo test -p flatnet-tests --test cri -- --ignored
/// run_pod_sandbox_latency --nocapture`).
#[flatnet_test(root, tools = cri_tools())]
#[ignore = "a benchmark: run it with --ignored"]
fn run_pod_sandbox_latency_flatnet_vs_bridge() {
    const RUNS: usize = 20;
    let mut node = Node::new(false);
    let client = node.client();
    // A first sandbox loads the datapath, and stays: a node has pods, and
    // the last pod's DEL unloads the network. Not what is measured.
    let warm = node.run_sandbox(&client, "warm");
    let flatnet = median_run_latency(&node, &client, RUNS, "flat");
    stop_and_remove(&client, &warm);

    // The baseline: the same containerd, its conf dir switched to bridge.
    let bridge = unique("flcb");
    let host_local_dir = node.dir.join("host-local");
    node.baseline = Some((bridge.clone(), host_local_dir.clone()));
    let octets: Vec<&str> = node.prefix.split('.').collect();
    let baseline_prefix = format!("10.{}.{}", 250, octets[2]);
    node.write_conf(
        "00-bridge.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": format!("{}-bridge", node.network),
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipam": {
                    "type": "host-local",
                    "subnet": format!("{baseline_prefix}.0/24"),
                    "dataDir": host_local_dir.display().to_string(),
                },
            }],
        }),
    );
    std::fs::remove_file(node.conf_dir().join("10-flatnet.conflist")).expect("switch the conf");
    // containerd reloads its conf dir on change: until then, sandboxes
    // still land on flatnet. The first on the bridge stays, as above.
    let mut warm_bridge = None;
    wait_until(
        "containerd to load the bridge conflist",
        Duration::from_secs(20),
        || {
            let warm = node.run_sandbox_raw(&client, "warmbridge");
            let ip = client.pod_sandbox_status(&warm).expect("status").ip;
            if ip.starts_with(&format!("{baseline_prefix}.")) {
                warm_bridge = Some(warm);
                return true;
            }
            client.stop_pod_sandbox(&warm).expect("stop");
            client.remove_pod_sandbox(&warm).expect("remove");
            false
        },
    );
    let bridge_median = median_run_latency(&node, &client, RUNS, "br");
    if let Some(id) = warm_bridge {
        client.stop_pod_sandbox(&id).expect("stop");
        client.remove_pod_sandbox(&id).expect("remove");
    }
    println!(
        "{}",
        json!({
            "bench": "cri_run_pod_sandbox",
            "runtime": client.version().unwrap_or_default(),
            "runs": RUNS,
            "flatnet_median_ms": (flatnet * 100.0).round() / 100.0,
            "bridge_median_ms": (bridge_median * 100.0).round() / 100.0,
        })
    );
}

impl Node {
    /// RunPodSandbox without the flatnet checks (the baseline network).
    fn run_sandbox_raw(&self, client: &CriClient, name: &str) -> String {
        client
            .run_pod_sandbox(&PodSpec::new(name))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()))
    }
}

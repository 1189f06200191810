//! Test harness: the plugins called like a runtime calls them, a per-test
//! network with its own name, subnet, gateway device and IPAM dir, pods,
//! traffic, and the simulated cluster. What xtask needs as well (network
//! namespaces, CNI calls, configuration lists, `unique`, `wait_until`, the
//! rule for a test that cannot run) is the `flatnet-harness` crate,
//! re-exported here whole.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::netlink::AttachmentNames;

pub mod cgroup;
pub mod cluster;
/// A real containerd with its CRI plugin, and the test images it runs.
pub mod containerd;
/// A CRI client: what kubelet sends containerd.
pub mod cri;
/// The node's forwarding switches, off as on a fresh machine.
pub mod forwarding;
/// Ethernet frames built byte by byte for the programs (BPF_PROG_TEST_RUN),
/// as Cilium's bpf/tests build theirs (pktgen.h).
pub mod frames;
/// Plugin binaries older than their sources are refused.
pub mod fresh;
/// One test binary, one file's tests at a time.
pub mod gate;
/// A stub of the Kubernetes API server: list and watch of the objects the
/// agent follows.
pub mod kube_stub;
/// The datapath's programs run on crafted frames (BPF_PROG_TEST_RUN).
pub mod test_run;
pub use flatnet_harness::*;
pub use flatnet_test_macros::flatnet_test;
/// kube-proxy's Service rules (its own crate: the benchmark uses it too).
pub use kube_proxy_fixture as kube_proxy;
use serde_json::{Value, json};

/// Where the built binaries are (FLATNET_BIN_DIR, which xtask sets, or
/// target/debug), checked to be newer than their sources on first use.
#[track_caller]
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo xtask test`",
        path.display()
    );
    if let Err(stale) = fresh::check(name, &path) {
        panic!("{stale}");
    }
    path
}

/// A tool a test needs: an absolute path or a program on PATH, with the
/// Debian package that brings it when the message should name one.
pub trait Needed {
    fn tool(&self) -> &str;
    fn package(&self) -> Option<&str> {
        None
    }
}

impl Needed for &str {
    fn tool(&self) -> &str {
        self
    }
}

impl Needed for (&str, &str) {
    fn tool(&self) -> &str {
        self.0
    }
    fn package(&self) -> Option<&str> {
        Some(self.1)
    }
}

impl Needed for (String, &str) {
    fn tool(&self) -> &str {
        &self.0
    }
    fn package(&self) -> Option<&str> {
        Some(self.1)
    }
}

/// The reference plugins `names` in REFERENCE_PLUGINS, as a test's tools.
pub fn reference_plugins(names: &[&str]) -> Vec<(String, &'static str)> {
    names
        .iter()
        .map(|name| {
            (
                format!("{REFERENCE_PLUGINS}/{name}"),
                "containernetworking-plugins",
            )
        })
        .collect()
}

/// What `#[flatnet_test]` checks before a test runs: root when `root`,
/// and each of `tools` (an absolute path, or a program on PATH). False
/// after a loud SKIPPED line, or, under `cargo xtask test` and in CI, a
/// panic naming what is missing and the package to install.
#[track_caller]
pub fn requirements<T: Needed>(test: &str, root: bool, tools: &[T]) -> bool {
    if root && !root_or_skip(test) {
        return false;
    }
    let missing = tools.iter().find(|needed| !tool_exists(needed.tool()));
    let why = match missing {
        None => String::new(),
        Some(needed) => match needed.package() {
            Some(package) => format!(
                "{} is missing (apt-get install {package}, or `cargo xtask setup`)",
                needed.tool()
            ),
            None => format!("{} is missing (not found on PATH)", needed.tool()),
        },
    };
    require(test, missing.is_none(), &why)
}

/// An absolute path that exists, or a program found on PATH.
pub fn tool_exists(tool: &str) -> bool {
    let path = Path::new(tool);
    if path.is_absolute() {
        return path.exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|dirs| std::env::split_paths(&dirs).any(|dir| dir.join(tool).is_file()))
}

/// True when root; otherwise false after a loud SKIPPED line (the test
/// then returns early), or, under `cargo xtask test` and in CI, a panic.
#[track_caller]
pub fn root_or_skip(test: &str) -> bool {
    require(
        test,
        is_root(),
        "needs root for network namespaces, veths and BPF",
    )
}

fn unique_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A flatnet network of one test: unique name, /24, gateway device and IPAM
/// state; everything it may leave on the node is removed on drop.
pub struct Network {
    pub name: String,
    pub gateway_device: String,
    pub subnet_prefix: String,
    pub ipam_dir: PathBuf,
    pub conf: Value,
}

impl Network {
    /// flatnet with the reference host-local IPAM on a fresh /24.
    pub fn host_local() -> Self {
        Self::with_ipam(
            |subnet, gateway, dir| json!({"type": "host-local", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
        )
    }

    /// flatnet with an IPAM section built from (subnet, gateway, data dir).
    pub fn with_ipam(ipam: impl FnOnce(&str, &str, &str) -> Value) -> Self {
        forwarding::pristine_host();
        let n = unique_number();
        // One /24 per network of this process: the second octet moves on
        // every 250 (the one test binary makes more than that in a run).
        let second = 100 + (std::process::id() + n / 250) % 100;
        let prefix = format!("10.{second}.{}", n % 250);
        let name = unique("ft-net-");
        let ipam_dir = std::env::temp_dir().join(format!("flatnet-test-ipam-{name}"));
        let subnet = format!("{prefix}.0/24");
        let gateway = format!("{prefix}.1");
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": name,
            "type": "flatnet",
            "bridge": unique("flg"),
            "ipam": ipam(&subnet, &gateway, &ipam_dir.display().to_string()),
        });
        Network {
            gateway_device: conf["bridge"].as_str().unwrap_or_default().to_string(),
            name,
            subnet_prefix: prefix,
            ipam_dir,
            conf,
        }
    }

    pub fn gateway(&self) -> Ipv4Addr {
        format!("{}.1", self.subnet_prefix)
            .parse()
            .expect("gateway")
    }

    pub fn stdin(&self) -> Vec<u8> {
        self.conf.to_string().into_bytes()
    }

    pub fn datapath(&self) -> Datapath {
        Datapath::new(&self.name)
    }

    pub fn call(&self, command: &str, container_id: &str, netns: &Path, ifname: &str) -> CniOutput {
        CniCall::new(command, container_id, netns, ifname).run(&bin("flatnet"), &self.stdin())
    }

    /// A new pod attached with ADD (panics if ADD fails); DEL on drop.
    pub fn pod(&self) -> Pod<'_> {
        let netns = Netns::new();
        let container_id = unique("ctr-");
        let out = self.call("ADD", &container_id, &netns.path(), "eth0");
        assert!(out.success(), "ADD failed: {out:?}");
        let result = out.json();
        Pod {
            network: self,
            netns,
            container_id,
            ifname: "eth0".into(),
            result,
        }
    }

    pub fn host_veth(&self, container_id: &str, ifname: &str) -> String {
        AttachmentNames::new(&self.name, container_id, ifname).host_veth
    }

    /// Allocation records host-local keeps (files named by address).
    pub fn ipam_allocations(&self) -> Vec<String> {
        let dir = self.ipam_dir.join(&self.name);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    pub fn redirected_packets(&self) -> u64 {
        self.datapath().stats().expect("STATS")[flatnet_common::action::REDIRECTED as usize].packets
    }

    /// Bytes the datapath redirected: on veths, segments are GSO-sized, so
    /// a transfer's packet count says little; its bytes do.
    pub fn redirected_bytes(&self) -> u64 {
        self.datapath().stats().expect("STATS")[flatnet_common::action::REDIRECTED as usize].bytes
    }

    pub fn action_packets(&self, action: u32) -> u64 {
        self.datapath().stats().expect("STATS")[action as usize].packets
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.gateway_device])
            .output();
        let _ = self.datapath().remove_pins();
        let _ = std::fs::remove_dir_all(&self.ipam_dir);
        // The plugin keeps a network's lock file (deleting a lock others may
        // wait on is unsafe); a test network is the test's alone.
        let _ = std::fs::remove_file(format!(
            "{}/{}.lock",
            flatnet_datapath::lock::LOCK_DIR,
            flatnet_datapath::lock::network(&self.name)
        ));
    }
}

/// A pod: its namespace and ADD result; DEL is called on drop.
pub struct Pod<'a> {
    pub network: &'a Network,
    pub netns: Netns,
    pub container_id: String,
    pub ifname: String,
    pub result: Value,
}

impl Pod<'_> {
    pub fn ip(&self) -> Ipv4Addr {
        match result_ips(&self.result).first() {
            Some(IpAddr::V4(ip)) => *ip,
            other => panic!("the pod's first address is not IPv4: {other:?}"),
        }
    }

    /// The pod's IPv6 (`v6`) or IPv4 address.
    pub fn address(&self, v6: bool) -> IpAddr {
        result_ips(&self.result)
            .into_iter()
            .find(|ip| ip.is_ipv6() == v6)
            .unwrap_or_else(|| {
                panic!(
                    "no IPv{} address in {}",
                    if v6 { 6 } else { 4 },
                    self.result
                )
            })
    }

    pub fn host_veth(&self) -> String {
        self.network.host_veth(&self.container_id, &self.ifname)
    }

    pub fn call(&self, command: &str) -> CniOutput {
        self.network.call(
            command,
            &self.container_id,
            &self.netns.path(),
            &self.ifname,
        )
    }

    /// The network config with this pod's ADD result as prevResult.
    pub fn stdin_with_prev_result(&self) -> Vec<u8> {
        let mut conf = self.network.conf.clone();
        conf["prevResult"] = self.result.clone();
        conf.to_string().into_bytes()
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let out = self.call("DEL");
        if !out.success() {
            eprintln!("cleanup DEL of {} failed: {out:?}", self.container_id);
        }
    }
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// rx and tx packet counters of a host interface.
pub fn link_packets(name: &str) -> (u64, u64) {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{name}/statistics/{what}"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    };
    (read("rx_packets"), read("tx_packets"))
}

/// The IPv4 ForwDatagrams counter of the calling thread's network
/// namespace (the host's, or a node's inside `Netns::run`).
pub fn forwarded_datagrams() -> u64 {
    // thread-self: /proc/net would show the process's namespace.
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
    let mut lines = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "ForwDatagrams")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0)
}

/// Opens a TCP echo server in `server_ns` on `ip`, connects from
/// `client_ns`, sends `bytes` bytes and checks they all come back intact.
pub fn tcp_echo(
    server_ns: Option<&Netns>,
    ip: impl Into<std::net::IpAddr>,
    client_ns: Option<&Netns>,
    bytes: usize,
) -> anyhow::Result<()> {
    tcp_echo_via(server_ns, (ip.into(), 0).into(), client_ns, None, bytes)
}

/// `tcp_echo` with the server bound to `bind` and the client connecting to
/// `connect` (a port mapping's address), or to the server's own address.
pub fn tcp_echo_via(
    server_ns: Option<&Netns>,
    bind: SocketAddr,
    client_ns: Option<&Netns>,
    connect: Option<SocketAddr>,
    bytes: usize,
) -> anyhow::Result<()> {
    let listener = in_ns(server_ns, || TcpListener::bind(bind))?;
    let local = listener.local_addr()?;
    let addr = connect.unwrap_or(local);
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            conn.write_all(&buf[..n])?;
        }
    });
    let payload: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let echoed = in_ns(client_ns, || -> anyhow::Result<Vec<u8>> {
        tcp_client(addr, &payload)
    });
    let echoed = match echoed {
        Ok(echoed) => echoed,
        Err(e) => {
            // Unblock the server's accept so its thread ends.
            let _ = in_ns(server_ns, || {
                TcpStream::connect_timeout(&bind_target(local), Duration::from_secs(1))
            });
            let _ = server.join();
            return Err(e);
        }
    };
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    anyhow::ensure!(
        echoed == payload,
        "echo differs: sent {} bytes, got {}",
        payload.len(),
        echoed.len()
    );
    Ok(())
}

/// Where to reach a listener bound to `bind` from its own namespace.
fn bind_target(bind: SocketAddr) -> SocketAddr {
    if bind.ip().is_unspecified() {
        SocketAddr::from((Ipv4Addr::LOCALHOST, bind.port()))
    } else {
        bind
    }
}

fn tcp_client(addr: SocketAddr, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = conn.try_clone()?;
    let data = payload.to_vec();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        writer.write_all(&data)?;
        writer.shutdown(std::net::Shutdown::Write)
    });
    let mut echoed = Vec::with_capacity(payload.len());
    conn.read_to_end(&mut echoed)?;
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    Ok(echoed)
}

/// Runs `f` in `ns` (on a thread that entered it), or here for the host.
pub fn in_ns<T: Send>(ns: Option<&Netns>, f: impl FnOnce() -> T + Send) -> T {
    match ns {
        Some(ns) => ns.run(f),
        None => f(),
    }
}

/// A flatnet-ipam network on its own (no interfaces): unique name and data
/// dir, removed on drop. `ipam` is the section without `type` and `dataDir`.
pub struct IpamNet {
    pub name: String,
    /// `dataDir`; the records live in `data_dir/name`.
    pub data_dir: PathBuf,
    pub conf: Value,
}

impl IpamNet {
    pub fn new(cni_version: &str, ipam: Value) -> Self {
        let name = unique("ft-ipam-");
        let data_dir = std::env::temp_dir().join(format!("flatnet-test-ipam-{name}"));
        let mut ipam = ipam;
        ipam["type"] = json!("flatnet-ipam");
        ipam["dataDir"] = json!(data_dir.display().to_string());
        let conf = json!({
            "cniVersion": cni_version,
            "name": name,
            "type": "bridge",
            "ipam": ipam,
        });
        IpamNet {
            name,
            data_dir,
            conf,
        }
    }

    pub fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }

    pub fn stdin(&self) -> Vec<u8> {
        self.conf.to_string().into_bytes()
    }

    /// An invocation as a delegating plugin makes it (the runtime's env).
    pub fn cni_call(&self, command: &str, container_id: &str, ifname: &str) -> CniCall {
        CniCall::new(
            command,
            container_id,
            Path::new("/proc/self/ns/net"),
            ifname,
        )
    }

    pub fn call(&self, command: &str, container_id: &str, ifname: &str) -> CniOutput {
        self.cni_call(command, container_id, ifname)
            .run(&bin("flatnet-ipam"), &self.stdin())
    }

    /// Names in the store directory that are addresses (the allocations).
    pub fn allocations(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .names()
            .into_iter()
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect();
        names.sort();
        names
    }

    /// Every name in the store directory.
    pub fn names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.store_dir()) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }
}

impl Drop for IpamNet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// DEL cuts a link off at once and leaves its unregister (tens of ms of RCU
/// waiting in the kernel) to a detached reaper: waits for it to vanish.
pub fn wait_link_gone(link: &str, timeout: Duration) -> bool {
    poll_until(timeout, POLL_INTERVAL, || !link_exists(link))
}

/// Sends one datagram of `len` bytes from `from` (bound to `from_ip`, DF
/// off so a node may fragment it) to a socket bound in `to` at `to_ip`;
/// the source address it arrived with.
pub fn udp_source(
    from: &Netns,
    from_ip: Ipv4Addr,
    to: &Netns,
    to_ip: Ipv4Addr,
    len: usize,
) -> IpAddr {
    let receiver = to
        .run(|| UdpSocket::bind((to_ip, 0)))
        .expect("bind receiver");
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let target = receiver.local_addr().unwrap();
    let payload = vec![0x5a_u8; len];
    from.run(|| {
        let socket = UdpSocket::bind((from_ip, 0)).unwrap();
        let dont = nix::libc::IP_PMTUDISC_DONT;
        // SAFETY: a valid socket and an int option of the size given.
        let rc = unsafe {
            nix::libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                nix::libc::IPPROTO_IP,
                nix::libc::IP_MTU_DISCOVER,
                (&dont as *const i32).cast(),
                size_of::<i32>() as u32,
            )
        };
        assert_eq!(rc, 0, "IP_MTU_DISCOVER");
        socket.send_to(&payload, target).unwrap();
    });
    let mut buf = vec![0u8; 2048];
    let (got, source) = receiver
        .recv_from(&mut buf)
        .expect("the datagram did not arrive");
    assert_eq!(&buf[..got], &payload[..]);
    source.ip()
}

/// An "outside host": a namespace of its own on a veth from the node (the
/// caller's namespace, or `node`'s), `<prefix>.1/24` on the node's end and
/// `<prefix>.2/24` on its `eth0`. The node's end goes on drop.
pub struct OutsideHost {
    pub netns: Netns,
    pub node_side: String,
    pub prefix: String,
    node: Option<PathBuf>,
}

impl OutsideHost {
    pub fn new(node: Option<&Netns>, prefix: &str) -> Self {
        let netns = Netns::new();
        let node_side = unique("fo");
        let in_node = |args: &[&str]| {
            let mut cmd = Command::new(args[0]);
            cmd.args(&args[1..]);
            if let Some(node) = node {
                enter(&mut cmd, &node.path()).expect("enter the node's netns");
            }
            run_ok(&mut cmd);
        };
        in_node(&[
            "ip",
            "link",
            "add",
            &node_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &netns.name,
        ]);
        in_node(&[
            "ip",
            "addr",
            "add",
            &format!("{prefix}.1/24"),
            "dev",
            &node_side,
        ]);
        in_node(&["ip", "link", "set", &node_side, "up"]);
        netns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{prefix}.2/24"),
            "dev",
            "eth0",
        ]);
        netns.exec(&["ip", "link", "set", "eth0", "up"]);
        OutsideHost {
            netns,
            node_side,
            prefix: prefix.to_string(),
            node: node.map(Netns::path),
        }
    }

    /// The outside host's own address.
    pub fn address(&self) -> Ipv4Addr {
        format!("{}.2", self.prefix)
            .parse()
            .expect("an IPv4 prefix")
    }
}

impl Drop for OutsideHost {
    fn drop(&mut self) {
        let mut cmd = Command::new("ip");
        cmd.args(["link", "del", &self.node_side]);
        if let Some(node) = &self.node
            && enter(&mut cmd, node).is_err()
        {
            return;
        }
        let _ = cmd.output();
    }
}

/// An attachment made through a configuration list, taken back on drop
/// even when the test panicked: DEL through the list (as libcni runs it
/// after a failed ADD too), then any host device a chained plugin named in
/// the result and left (the bandwidth plugin's ifb device).
pub struct ListAttachment<'a> {
    list: &'a Conflist,
    pub call: CniCall,
    pub runtime_config: Value,
    /// The list's result; Null until ADD succeeded.
    pub result: Value,
    deleted: bool,
}

impl<'a> ListAttachment<'a> {
    /// ADD through `list`; the guard is armed before ADD runs.
    pub fn add(
        list: &'a Conflist,
        call: CniCall,
        runtime_config: Value,
    ) -> Result<Self, ChainError> {
        let mut attachment = ListAttachment {
            list,
            call,
            runtime_config,
            result: Value::Null,
            deleted: false,
        };
        attachment.result = list.add(&attachment.call, &attachment.runtime_config)?;
        Ok(attachment)
    }

    /// Host devices of the result that are not the pod's, nor flatnet's
    /// host veth: what a chained plugin made (the bandwidth plugin's ifb).
    pub fn chained_devices(&self) -> Vec<String> {
        let flatnet_veth = self.result["interfaces"][0]["name"].as_str();
        self.result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i.get("sandbox").is_none())
            .filter_map(|i| i["name"].as_str())
            .filter(|name| Some(*name) != flatnet_veth)
            .map(str::to_string)
            .collect()
    }

    /// DEL through the list in reverse order; the guard is then disarmed.
    pub fn del(&mut self) -> Result<(), ChainError> {
        let result = (!self.result.is_null()).then_some(&self.result);
        self.list.del(&self.call, &self.runtime_config, result)?;
        self.deleted = true;
        Ok(())
    }
}

impl Drop for ListAttachment<'_> {
    fn drop(&mut self) {
        if !self.deleted
            && let Err(e) = self.del()
        {
            eprintln!("cleanup DEL of {}: {e}", self.call.container_id);
        }
        for device in self.chained_devices() {
            if link_exists(&device) {
                let _ = Command::new("ip").args(["link", "del", &device]).output();
            }
        }
    }
}

impl Network {
    /// This network's flatnet configuration as an entry of a list (without
    /// the `name` and `cniVersion` the list gives it).
    pub fn plugin_entry(&self) -> Value {
        let mut entry = self.conf.clone();
        if let Some(map) = entry.as_object_mut() {
            map.remove("name");
            map.remove("cniVersion");
        }
        entry
    }

    /// A list with flatnet first and `more` after it.
    pub fn conflist(&self, cni_version: &str, more: Vec<Value>) -> Conflist {
        let mut plugins = vec![self.plugin_entry()];
        plugins.extend(more);
        Conflist::new(json!({"cniVersion": cni_version, "name": self.name, "plugins": plugins}))
    }

    /// flatnet with flatnet-ipam on a fresh /24.
    pub fn flatnet_ipam() -> Self {
        Self::with_ipam(
            |subnet, gateway, dir| json!({"type": "flatnet-ipam", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
        )
    }

    /// Dual stack in datapath `mode`: a fresh /24 and a matching /64,
    /// flatnet-ipam handing out one address of each.
    pub fn dual_stack(mode: &str) -> Self {
        let mut net = Self::with_ipam(|subnet, gateway, dir| {
            let octets: Vec<u32> = subnet
                .split(['.', '/'])
                .filter_map(|p| p.parse().ok())
                .collect();
            let v6 = format!("fd42:{:x}:{:x}::", octets[1], octets[2]);
            json!({
                "type": "flatnet-ipam",
                "ranges": [
                    [{"subnet": subnet, "gateway": gateway}],
                    [{"subnet": format!("{v6}/64"), "gateway": format!("{v6}1")}]
                ],
                "dataDir": dir
            })
        });
        net.conf["datapath"] = json!(mode);
        net
    }
}

/// What bpftool printed, for a test: judged by its output (bookworm-backports'
/// 7.5.0 exits 255 after a correct `link show`), panics on a real error.
#[track_caller]
pub fn bpftool_ok(cmd: &mut Command) -> String {
    bpftool(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// One entry at a tc hook of a device, as `bpftool net` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcHook {
    /// "tcx/ingress", "clsact/ingress", ...
    pub kind: String,
    pub program: String,
    pub program_id: u32,
    /// The BPF link holding it (tcx), None for a cls_bpf filter.
    pub link_id: Option<u32>,
}

/// Waits until `dev`'s only tc program is on a tcx link: ADD attaches a
/// cls_bpf filter and moves it to its link in a process it leaves behind.
pub fn wait_for_tcx(dev: &str) {
    wait_until(
        &format!("{dev} to be on its tcx link alone"),
        Duration::from_secs(10),
        || {
            let hooks = tc_hooks(dev);
            hooks.len() == 1 && hooks[0].link_id.is_some()
        },
    );
}

/// What sits at the tc hooks of `dev` in the caller's namespace (tcx links
/// and cls_bpf filters), from `bpftool -j net show` (bpftool 7.3+ for tcx).
pub fn tc_hooks(dev: &str) -> Vec<TcHook> {
    let out = bpftool_ok(Command::new("bpftool").args(["-j", "net", "show", "dev", dev]));
    let listed: Value = serde_json::from_str(&out).expect("bpftool's JSON");
    let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    listed[0]["tc"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| TcHook {
            kind: entry["kind"].as_str().unwrap_or_default().to_string(),
            program: entry["name"].as_str().unwrap_or_default().to_string(),
            // "prog_id" for tcx, "id" for a cls_bpf filter.
            program_id: id(&entry["prog_id"])
                .or_else(|| id(&entry["id"]))
                .unwrap_or_default(),
            link_id: id(&entry["link_id"]),
        })
        .collect()
}

/// Streams bytes from `client` to a server in `server` while `during`
/// runs; returns (sent, received). A reset or stall fails the test.
pub fn stream_during(
    server: &Netns,
    ip: impl Into<std::net::IpAddr>,
    client: &Netns,
    during: impl FnOnce(),
) -> (u64, u64) {
    let ip = ip.into();
    let listener = server.run(|| TcpListener::bind((ip, 0)).unwrap());
    let addr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match conn.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n as u64,
                Err(e) => panic!("receiver: {e} after {total} bytes"),
            }
        }
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client_path = client.path();
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            enter_thread(&client_path).expect("enter the client's namespace");
            let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            conn.set_write_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let chunk = vec![7u8; 16 * 1024];
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = conn.write_all(&chunk) {
                    panic!("sender: {e} after {sent} bytes");
                }
                sent += chunk.len() as u64;
                // Paced, so the stream spans the whole of `during`.
                std::thread::sleep(Duration::from_micros(200));
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    during();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender");
    let received = receiver.join().expect("receiver");
    (sent, received)
}

//! Test harness: network namespaces that clean up after themselves, one
//! thread per namespace, the plugins called like a runtime calls them, and a
//! per-test network with its own name, subnet, gateway device and IPAM dir.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use flatnet::datapath::Datapath;
use flatnet::net::AttachmentNames;

pub mod cluster;
/// The datapath's programs run on crafted frames (BPF_PROG_TEST_RUN).
pub mod test_run;
/// kube-proxy's Service rules (its own crate: the benchmark uses it too).
pub use kube_proxy_fixture as kube_proxy;
use nix::sched::{CloneFlags, setns};
use serde_json::{Value, json};

/// Where the built binaries are (xtask sets FLATNET_BIN_DIR).
pub fn bin_dir() -> PathBuf {
    std::env::var_os("FLATNET_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug"))
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo xtask test`",
        path.display()
    );
    path
}

/// CNI_PATH for tests: our binaries first, then Debian's reference plugins.
pub fn cni_path() -> String {
    format!("{}:/usr/lib/cni", bin_dir().display())
}

/// False (and a loud line) when not root: the test then returns early.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED {test}: needs root (network namespaces, veths, BPF)");
    false
}

/// A short name unique to this process and call: `<prefix><pid><n>` in hex.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:x}", std::process::id() & 0xfffff)
}

fn unique_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Self {
        let name = unique("ftest-");
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        // Loopback up, as a runtime would have it.
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs `f` on a thread that has entered this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = File::open(self.path()).expect("open netns");
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                    f()
                })
                .join()
                .expect("netns thread panicked")
        })
    }

    /// Runs a command inside the namespace; panics when it fails.
    pub fn exec(&self, args: &[&str]) -> String {
        run_ok(
            Command::new("ip")
                .args(["netns", "exec", &self.name])
                .args(args),
        )
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a plugin printed and how it exited.
#[derive(Debug)]
pub struct CniOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CniOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Asserts a CNI error object with `code` whose message contains `needle`.
    pub fn assert_error(&self, code: u64, needle: &str) {
        assert!(!self.success(), "expected failure, got {self:?}");
        let obj = self.json();
        assert_eq!(obj["code"], code, "{self:?}");
        let msg = obj["msg"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
        assert!(!self.stderr.is_empty(), "a human line belongs on stderr");
    }
}

/// One plugin invocation, environment and all.
#[derive(Debug, Clone, Default)]
pub struct CniCall {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub path: String,
    pub args: String,
}

impl CniCall {
    pub fn new(command: &str, container_id: &str, netns: &Path, ifname: &str) -> Self {
        CniCall {
            command: command.into(),
            container_id: container_id.into(),
            netns: netns.display().to_string(),
            ifname: ifname.into(),
            path: cni_path(),
            args: String::new(),
        }
    }

    /// Starts the plugin with `stdin` written and closed; for tests that
    /// kill it or start many at once.
    pub fn spawn(&self, plugin: &Path, stdin: &[u8]) -> std::process::Child {
        let mut child = self
            .command(plugin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plugin");
        // A configuration fits in the pipe buffer; a plugin killed early is fine.
        let _ = child.stdin.take().expect("stdin").write_all(stdin);
        child
    }

    fn command(&self, plugin: &Path) -> Command {
        let mut cmd = Command::new(plugin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (key, value) in [
            ("CNI_COMMAND", &self.command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
            ("CNI_ARGS", &self.args),
        ] {
            if !value.is_empty() {
                cmd.env(key, value);
            }
        }
        cmd
    }

    pub fn run(&self, plugin: &Path, stdin: &[u8]) -> CniOutput {
        run_with_stdin(&mut self.command(plugin), stdin)
    }
}

/// Runs a plugin command (env already set) with `stdin`, as a runtime
/// does, and collects what it answered.
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8]) -> CniOutput {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    // Written from a thread: a plugin may answer before reading it all (a
    // 10 MB stdin).
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait plugin");
    let _ = writer.join();
    CniOutput::from(out)
}

impl From<std::process::Output> for CniOutput {
    fn from(out: std::process::Output) -> Self {
        CniOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
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
        let n = unique_number();
        let prefix = format!("10.{}.{}", 100 + (std::process::id() % 100), n % 250);
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
            flatnet::lock::LOCK_DIR,
            flatnet::lock::network(&self.name)
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
        let address = self.result["ips"][0]["address"].as_str().expect("address");
        address
            .split('/')
            .next()
            .and_then(|ip| ip.parse().ok())
            .expect("IPv4 address")
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
    let deadline = std::time::Instant::now() + timeout;
    while link_exists(link) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The plugin binary `kind` as a runtime finds it: the first in CNI_PATH.
pub fn find_plugin(kind: &str, cni_path: &str) -> PathBuf {
    std::env::split_paths(cni_path)
        .map(|dir| dir.join(kind))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("plugin {kind} is not in CNI_PATH {cni_path}"))
}

/// Which plugin of a list failed, and how.
#[derive(Debug)]
pub struct ChainError {
    pub plugin: String,
    pub output: CniOutput,
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {} failed ({:?}): {} {}",
            self.plugin, self.output.code, self.output.stdout, self.output.stderr
        )
    }
}

impl std::error::Error for ChainError {}

/// The CNI versions a list runner here understands, oldest first.
const LIST_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn version_rank(version: &str) -> Option<usize> {
    LIST_VERSIONS.iter().position(|v| *v == version)
}

/// A network configuration list, run the way libcni runs one: each plugin's
/// configuration gets the list's `name` and `cniVersion`, a `runtimeConfig`
/// with the runtime's values for the capabilities it declares, and a
/// `prevResult` (ADD: the previous plugin's result; CHECK and DEL: the
/// list's ADD result); DEL runs the plugins in reverse order; CHECK is
/// skipped before 0.4.0 and with `disableCheck`, GC and STATUS before 1.1.0.
pub struct Conflist {
    pub list: Value,
}

impl Conflist {
    pub fn new(list: Value) -> Self {
        Conflist { list }
    }

    /// `cniVersions` (1.1.0): the newest one understood; else `cniVersion`.
    pub fn version(&self) -> String {
        if let Some(versions) = self.list["cniVersions"].as_array() {
            let best = versions
                .iter()
                .filter_map(Value::as_str)
                .filter_map(version_rank)
                .max();
            if let Some(best) = best {
                return LIST_VERSIONS[best].to_string();
            }
        }
        self.list["cniVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn plugins(&self) -> Vec<Value> {
        self.list["plugins"].as_array().cloned().unwrap_or_default()
    }

    /// One plugin's stdin.
    pub fn plugin_conf(
        &self,
        plugin: &Value,
        runtime_config: &Value,
        prev_result: Option<&Value>,
    ) -> Value {
        let mut conf = plugin.clone();
        conf["name"] = self.list["name"].clone();
        conf["cniVersion"] = json!(self.version());
        let mut rc = serde_json::Map::new();
        if let Some(caps) = plugin["capabilities"].as_object() {
            for (cap, on) in caps {
                if on.as_bool() == Some(true)
                    && let Some(value) = runtime_config.get(cap)
                {
                    rc.insert(cap.clone(), value.clone());
                }
            }
        }
        if !rc.is_empty() {
            conf["runtimeConfig"] = Value::Object(rc);
        }
        if let Some(prev) = prev_result {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    fn run_plugin(
        &self,
        call: &CniCall,
        command: &str,
        conf: &Value,
    ) -> Result<CniOutput, ChainError> {
        let kind = conf["type"].as_str().unwrap_or_default().to_string();
        let mut call = call.clone();
        call.command = command.into();
        let out = call.run(&find_plugin(&kind, &call.path), conf.to_string().as_bytes());
        if out.success() {
            Ok(out)
        } else {
            Err(ChainError {
                plugin: kind,
                output: out,
            })
        }
    }

    /// ADD through the whole list; the last plugin's result.
    pub fn add(&self, call: &CniCall, runtime_config: &Value) -> Result<Value, ChainError> {
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, runtime_config, prev.as_ref());
            let out = self.run_plugin(call, "ADD", &conf)?;
            prev = Some(out.json());
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK through the whole list against the ADD `result`.
    pub fn check(
        &self,
        call: &CniCall,
        runtime_config: &Value,
        result: &Value,
    ) -> Result<(), ChainError> {
        let disabled =
            self.list["disableCheck"] == json!(true) || self.list["disableCheck"] == json!("true");
        if disabled || version_rank(&self.version()) < version_rank("0.4.0") {
            return Ok(());
        }
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, runtime_config, Some(result));
            self.run_plugin(call, "CHECK", &conf)?;
        }
        Ok(())
    }

    /// CHECK through the whole list, going on past the failures `known`
    /// accepts (a reference plugin's own bug); returns those.
    pub fn check_tolerating(
        &self,
        call: &CniCall,
        runtime_config: &Value,
        result: &Value,
        known: impl Fn(&ChainError) -> bool,
    ) -> Result<Vec<ChainError>, ChainError> {
        let mut tolerated = Vec::new();
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, runtime_config, Some(result));
            match self.run_plugin(call, "CHECK", &conf) {
                Ok(_) => {}
                Err(e) if known(&e) => tolerated.push(e),
                Err(e) => return Err(e),
            }
        }
        Ok(tolerated)
    }

    /// DEL through the list in reverse order (with the ADD result if known).
    pub fn del(
        &self,
        call: &CniCall,
        runtime_config: &Value,
        result: Option<&Value>,
    ) -> Result<(), ChainError> {
        for plugin in self.plugins().iter().rev() {
            let conf = self.plugin_conf(plugin, runtime_config, result);
            self.run_plugin(call, "DEL", &conf)?;
        }
        Ok(())
    }

    /// GC of every plugin with the still valid (containerID, ifname) pairs.
    pub fn gc(&self, call: &CniCall, valid: &[(&str, &str)]) -> Result<(), ChainError> {
        if version_rank(&self.version()) < version_rank("1.1.0") {
            return Ok(());
        }
        let attachments: Vec<Value> = valid
            .iter()
            .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
            .collect();
        for plugin in self.plugins() {
            let mut conf = self.plugin_conf(&plugin, &json!({}), None);
            conf["cni.dev/valid-attachments"] = json!(attachments);
            self.run_plugin(call, "GC", &conf)?;
        }
        Ok(())
    }

    /// STATUS of every plugin, in order.
    pub fn status(&self, call: &CniCall) -> Result<(), ChainError> {
        if version_rank(&self.version()) < version_rank("1.1.0") {
            return Ok(());
        }
        for plugin in self.plugins() {
            let conf = self.plugin_conf(&plugin, &json!({}), None);
            self.run_plugin(call, "STATUS", &conf)?;
        }
        Ok(())
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
            let ns = File::open(client_path).unwrap();
            setns(&ns, CloneFlags::CLONE_NEWNET).unwrap();
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

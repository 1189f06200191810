//! A simulated cluster on this machine: nodes are network namespaces on an
//! underlay (each node's `up0` is a veth into a switch namespace, whose
//! bridge joins them), each node runs `flatnet-agent` (static peer file or a
//! stub of the Kubernetes API server) with its own pin root on a test-owned
//! bpffs, and pods on each node are made through the plugin the agent
//! installed, with the conflist it wrote. Plugins and agents run in the
//! host's mount namespace entered into their node's network namespace only,
//! so the bpffs and the pins are the same for all of them.
//!
//! Node i has underlay address 172.30.0.i/24 (fd30::i/64 when dual-stack)
//! and pod CIDR 10.244.i.0/24 (fd44:0:0:i::/64).

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use flatnet_datapath::bpf::Datapath;
use serde_json::Value;

use crate::*;

/// flatnet's route protocol number (agent::routes::RTPROT_FLATNET).
pub const ROUTE_PROTO: &str = "102";
pub const METRICS_PORT: u16 = 9603;
/// Generous: agents and plugins share two cores with the other suites.
pub const SETTLE: Duration = Duration::from_secs(20);

/// What a peer file or Node object says about one node.
#[derive(Clone)]
pub struct NodeSpec {
    pub name: String,
    pub index: u8,
    /// None: no pod CIDR allocated yet.
    pub pod_cidr: Option<String>,
    /// Dual-stack: also fd30::<index> on the underlay and pod CIDR
    /// fd44:0:0:<index>::/64.
    pub dual_stack: bool,
}

impl NodeSpec {
    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 30, 0, self.index)
    }

    pub fn address6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, u16::from(self.index))
    }

    pub fn pod_cidr6(&self) -> String {
        format!("fd44:0:0:{:x}::/64", self.index)
    }
}

/// How the agents learn the nodes.
pub enum Peers {
    File(PathBuf),
    Api(String),
}

/// One simulated node.
pub struct SimNode {
    pub spec: NodeSpec,
    pub network: String,
    pub netns: Netns,
    pub dir: PathBuf,
    pub pin_root: PathBuf,
    pub agent: Mutex<Option<Child>>,
    /// Agent flags besides the common ones (`--ip-masq true`, ...).
    pub agent_flags: Vec<String>,
    /// The plugin's stdin as last built from the conflist: DEL still has it
    /// once an uninstall removed the conflist, as a runtime keeps its copy.
    pub plugin_stdin: Mutex<Option<Vec<u8>>>,
}

impl SimNode {
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("bin")
    }

    pub fn conflist_path(&self) -> PathBuf {
        self.dir.join("conf/10-flatnet.conflist")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("agent.log")
    }

    pub fn ready_marker(&self) -> PathBuf {
        flatnet_datapath::node::markers::ready_marker(&self.network)
    }

    /// flatnet-agent with this node's network, directories and pin root,
    /// run in the node's network namespace, logging to the node's log.
    pub fn agent_command(&self) -> Command {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("agent log");
        let mut cmd = Command::new(bin("flatnet-agent"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["--network", &self.network])
            .arg("--cni-conf-dir")
            .arg(self.dir.join("conf"))
            .arg("--cni-bin-dir")
            .arg(self.bin_dir())
            .arg("--ipam-data-dir")
            .arg(self.dir.join("ipam"))
            .arg("--pin-root")
            .arg(&self.pin_root)
            .args(&self.agent_flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        enter(&mut cmd, &self.netns.path()).expect("open the node's netns");
        cmd
    }

    /// `flatnet-agent --uninstall` on this node, as the uninstall
    /// DaemonSet runs it; whether it succeeded.
    pub fn uninstall(&self) -> bool {
        self.agent_command()
            .arg("--uninstall")
            .status()
            .expect("run flatnet-agent --uninstall")
            .success()
    }

    pub fn start_agent(&self, peers: &Peers) {
        let mut cmd = self.agent_command();
        cmd.args(["--node-name", &self.spec.name])
            .arg("--install-from")
            .arg(bin_dir())
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{METRICS_PORT}"),
                "--log",
                "info",
            ]);
        if !self.agent_flags.iter().any(|f| f == "--resync-secs") {
            cmd.args(["--resync-secs", "2"]);
        }
        match peers {
            Peers::File(path) => {
                cmd.args(["--peer-source", "file", "--peer-file-poll-ms", "100"])
                    .arg("--peer-file")
                    .arg(path);
            }
            Peers::Api(url) => {
                cmd.args(["--peer-source", "kubernetes", "--kube-api-server", url]);
            }
        }
        let child = cmd.spawn().expect("spawn flatnet-agent");
        *self.agent.lock().unwrap() = Some(child);
    }

    /// SIGTERM, as a DaemonSet rollout does; SIGKILL after 10 s.
    pub fn stop_agent(&self) {
        let Some(mut child) = self.agent.lock().unwrap().take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = poll_until(Duration::from_secs(10), POLL_INTERVAL, || {
            !matches!(child.try_wait(), Ok(None))
        });
        if !exited || child.try_wait().is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn wait_ready(&self) {
        let mut exited = None;
        let ready = poll_until(SETTLE, POLL_INTERVAL, || {
            // The status is taken out first: a panic under the lock would
            // poison it for the cleanup that follows.
            exited = self
                .agent
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            exited.is_some() || (self.ready_marker().exists() && self.conflist_path().exists())
        });
        if let Some(status) = exited {
            panic!(
                "agent of {} exited ({status}):\n{}",
                self.spec.name,
                self.agent_log()
            );
        }
        assert!(
            ready,
            "agent of {} not ready:\n{}",
            self.spec.name,
            self.agent_log()
        );
    }

    pub fn conflist(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.conflist_path()).expect("conflist"))
            .expect("conflist JSON")
    }

    /// The flatnet plugin's stdin as a runtime builds it from the conflist.
    pub fn plugin_stdin(&self) -> Vec<u8> {
        let mut cached = self.plugin_stdin.lock().unwrap();
        if self.conflist_path().exists() || cached.is_none() {
            let stdin = Conflist::new(self.conflist()).first_plugin_conf();
            *cached = Some(stdin.to_string().into_bytes());
        }
        cached.clone().expect("plugin stdin")
    }

    /// Runs the installed plugin on this node as a runtime would: with the
    /// CNI variables only (the pin root comes from the conflist).
    pub fn cni(&self, command: &str, container: Option<(&str, &Path)>) -> CniOutput {
        self.cni_with_env(command, container, &[])
    }

    /// `cni`, with more environment for the plugin.
    pub fn cni_with_env(
        &self,
        command: &str,
        container: Option<(&str, &Path)>,
        env: &[(&str, &Path)],
    ) -> CniOutput {
        let mut call = match container {
            Some((id, netns)) => CniCall::new(command, id, netns, "eth0"),
            None => CniCall {
                command: command.into(),
                ..CniCall::default()
            },
        };
        call.path = self.bin_dir().display().to_string();
        call.node = Some(self.netns.path());
        call.env = env
            .iter()
            .map(|(key, value)| (key.to_string(), value.as_os_str().to_owned()))
            .collect();
        call.run(&self.bin_dir().join("flatnet"), &self.plugin_stdin())
    }

    pub fn pod(&self) -> SimPod<'_> {
        let netns = Netns::new();
        self.pod_in(netns, "")
    }

    /// A pod in `netns` (made by the caller, who may already run things in
    /// it), added with `cni_args` as CNI_ARGS (kubelet's
    /// `K8S_POD_NAMESPACE=..;K8S_POD_NAME=..`).
    pub fn pod_in(&self, netns: Netns, cni_args: &str) -> SimPod<'_> {
        let container = unique("cpod-");
        let mut call = CniCall::new("ADD", &container, &netns.path(), "eth0");
        call.path = self.bin_dir().display().to_string();
        call.node = Some(self.netns.path());
        call.args = cni_args.to_string();
        let out = call.run(&self.bin_dir().join("flatnet"), &self.plugin_stdin());
        assert!(out.success(), "ADD on {} failed: {out:?}", self.spec.name);
        let result = out.json();
        let addresses = result_ips(&result);
        let ip = addresses
            .iter()
            .find_map(|a| match a {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .expect("IPv4 address");
        let ip6 = addresses.iter().find_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        SimPod {
            node: self,
            netns,
            container,
            ip,
            ip6,
            result,
        }
    }

    pub fn datapath(&self) -> Datapath {
        Datapath::with_root(&self.pin_root, &self.network)
    }

    pub fn packets(&self, what: u32) -> u64 {
        self.datapath().stats().expect("STATS")[what as usize].packets
    }

    /// Bytes of an action: what a transfer moved, however the pods' TCP
    /// cut it into (GSO) packets.
    pub fn bytes(&self, what: u32) -> u64 {
        self.datapath().stats().expect("STATS")[what as usize].bytes
    }

    /// flatnet's routes on this node: "CIDR via ADDRESS".
    pub fn routes(&self) -> Vec<String> {
        let mut routes: Vec<String> = run_ok(Command::new("ip").args([
            "-n",
            &self.netns.name,
            "-4",
            "route",
            "show",
            "proto",
            ROUTE_PROTO,
        ]))
        .lines()
        .map(|line| {
            line.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
        routes.sort();
        routes
    }

    pub fn remote_cidrs(&self) -> Vec<String> {
        let mut cidrs: Vec<String> = self
            .datapath()
            .remote_cidrs()
            .expect("remote CIDRs")
            .into_iter()
            .map(|(cidr, via)| format!("{cidr} via {via}"))
            .collect();
        cidrs.sort();
        cidrs
    }

    /// The node stack's IPv4 ForwDatagrams: packets it routed itself.
    pub fn forwarded(&self) -> u64 {
        self.netns.run(forwarded_datagrams)
    }

    /// The agent's /metrics page.
    pub fn metrics(&self) -> String {
        self.agent_http("/metrics")
    }

    /// `GET path` of the agent's metrics server: the whole response,
    /// status line first.
    pub fn agent_http(&self, path: &str) -> String {
        self.netns.run(|| {
            let mut conn =
                TcpStream::connect((Ipv4Addr::LOCALHOST, METRICS_PORT)).expect("metrics port");
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
                .unwrap();
            let mut page = String::new();
            conn.read_to_string(&mut page).unwrap();
            page
        })
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        self.stop_agent();
        for path in [
            flatnet_datapath::node::markers::ready_marker(&self.network),
            flatnet_datapath::node::markers::managed_marker(&self.network),
            PathBuf::from(format!("/run/flatnet/network-{}.lock", self.network)),
            // An agent-managed network keeps these past its last DEL; the
            // node's namespace (and its nftables table) goes with the test.
            PathBuf::from(format!("/run/flatnet/masq-{}", self.network)),
            // The agent's record of which policies select which pod.
            flatnet_datapath::node::markers::policy_names_file(&self.network),
            // What the agent tells ADD of the namespaces' policies.
            flatnet_datapath::node::first_packet::isolation_file(&self.network),
        ] {
            let _ = std::fs::remove_file(path);
        }
        // ADD's pod records (its pods' DELs took theirs).
        flatnet_datapath::node::first_packet::PodRecord::remove_all(&self.network);
        let _ = std::fs::remove_dir_all(format!("/run/flatnet/slots-{}", self.network));
    }
}

/// A pod on a simulated node; DEL on drop.
pub struct SimPod<'a> {
    pub node: &'a SimNode,
    pub netns: Netns,
    pub container: String,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address on a dual-stack node.
    pub ip6: Option<Ipv6Addr>,
    /// What ADD answered: a chained plugin's prevResult.
    pub result: Value,
}

impl Drop for SimPod<'_> {
    fn drop(&mut self) {
        let out = self
            .node
            .cni("DEL", Some((&self.container, &self.netns.path())));
        if !out.success() {
            eprintln!("cleanup DEL of {} failed: {out:?}", self.container);
        }
    }
}

/// The switch, the nodes and the test-owned bpffs; all removed on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub bpffs: PathBuf,
    pub peer_file: PathBuf,
    pub nodes: Vec<SimNode>,
    pub _switch: Netns,
}

impl Cluster {
    /// Nodes on the underlay, agents not started.
    pub fn new(specs: &[NodeSpec]) -> Self {
        let id = unique("fc");
        let dir = std::env::temp_dir().join(format!("flatnet-cluster-{id}"));
        let bpffs = dir.join("bpf");
        std::fs::create_dir_all(&bpffs).expect("cluster dir");
        nix::mount::mount(
            Some("bpf"),
            &bpffs,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
        )
        .expect("mount a test bpffs");
        let switch = Netns::new();
        switch.exec(&["ip", "link", "add", "br0", "type", "bridge"]);
        switch.exec(&["ip", "link", "set", "br0", "up"]);
        let mut cluster = Cluster {
            peer_file: dir.join("peers.yaml"),
            dir: dir.clone(),
            bpffs: bpffs.clone(),
            nodes: Vec::new(),
            _switch: switch,
        };
        for spec in specs {
            let netns = Netns::new();
            // A fresh node: what needs forwarding must turn it on itself.
            crate::forwarding::off_in(&netns);
            let port = format!("p{}", spec.index);
            run_ok(Command::new("ip").args([
                "-n",
                &cluster._switch.name,
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "up0",
                "netns",
                &netns.name,
            ]));
            cluster
                ._switch
                .exec(&["ip", "link", "set", &port, "master", "br0", "up"]);
            netns.exec(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", spec.address()),
                "dev",
                "up0",
            ]);
            if spec.dual_stack {
                netns.exec(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/64", spec.address6()),
                    "dev",
                    "up0",
                    "nodad",
                ]);
            }
            netns.exec(&["ip", "link", "set", "up0", "up"]);
            let node_dir = dir.join(&spec.name);
            std::fs::create_dir_all(&node_dir).expect("node dir");
            cluster.nodes.push(SimNode {
                spec: spec.clone(),
                network: format!("{id}-{}", spec.name),
                netns,
                pin_root: bpffs.join(&spec.name),
                dir: node_dir,
                agent: Mutex::new(None),
                agent_flags: Vec::new(),
                plugin_stdin: Mutex::new(None),
            });
        }
        cluster
    }

    /// `count` nodes n1..n<count>, each with a pod CIDR, all in the peer
    /// file, agents started and ready.
    pub fn with_file_agents(count: u8) -> Self {
        Self::with_file_agents_flagged(count, &[])
    }

    /// As [`Self::with_file_agents`], each agent also given `flags`.
    pub fn with_file_agents_flagged(count: u8, flags: &[&str]) -> Self {
        Self::started(&Self::numbered(count, false), flags)
    }

    /// `count` nodes n1..n<count> with an IPv4 pod CIDR each (and an IPv6
    /// one when `dual_stack`).
    pub fn numbered(count: u8, dual_stack: bool) -> Vec<NodeSpec> {
        (1..=count)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                index: i,
                pod_cidr: Some(format!("10.244.{i}.0/24")),
                dual_stack,
            })
            .collect()
    }

    /// Nodes of `specs`, all in the peer file, agents (given `flags`)
    /// started and ready.
    pub fn started(specs: &[NodeSpec], flags: &[&str]) -> Self {
        let mut cluster = Self::new(specs);
        for node in &mut cluster.nodes {
            node.agent_flags = flags.iter().map(|f| f.to_string()).collect();
        }
        cluster.write_peers(specs);
        for node in &cluster.nodes {
            node.start_agent(&cluster.file());
        }
        for node in &cluster.nodes {
            node.wait_ready();
        }
        cluster
    }

    pub fn file(&self) -> Peers {
        Peers::File(self.peer_file.clone())
    }

    /// Replaces the peer file (whole, by rename, as a ConfigMap update does).
    pub fn write_peers(&self, specs: &[NodeSpec]) {
        let mut text = String::from("nodes:\n");
        for spec in specs {
            if spec.dual_stack {
                text.push_str(&format!(
                    "  - name: {}\n    addresses: [{}, '{}']\n",
                    spec.name,
                    spec.address(),
                    spec.address6()
                ));
                if let Some(cidr) = &spec.pod_cidr {
                    text.push_str(&format!("    podCIDRs: [{cidr}, '{}']\n", spec.pod_cidr6()));
                }
            } else {
                text.push_str(&format!(
                    "  - name: {}\n    address: {}\n",
                    spec.name,
                    spec.address()
                ));
                if let Some(cidr) = &spec.pod_cidr {
                    text.push_str(&format!("    podCIDR: {cidr}\n"));
                }
            }
        }
        let temp = self.dir.join(".peers.yaml.tmp");
        std::fs::write(&temp, text).expect("peer file");
        std::fs::rename(&temp, &self.peer_file).expect("peer file");
    }

    /// `stub` served on each node's own loopback (where its agent runs),
    /// every node's agent started against it and ready. The servers stop
    /// when the returned handles drop.
    pub fn start_agents_on_api(
        &self,
        stub: &crate::kube_stub::ApiStub,
    ) -> Vec<crate::kube_stub::ServedStub> {
        let served: Vec<_> = self
            .nodes
            .iter()
            .map(|node| {
                let listener = node
                    .netns
                    .run(|| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
                    .expect("a loopback listener in the node");
                crate::kube_stub::ServedStub::serve(stub.clone(), listener)
            })
            .collect();
        for (node, served) in self.nodes.iter().zip(&served) {
            node.start_agent(&Peers::Api(served.url.clone()));
        }
        for node in &self.nodes {
            node.wait_ready();
        }
        served
    }

    /// What every node's kube-proxy in `mode` programs for `services` (all
    /// nodes see all Services), the rules of the kube-proxy fixture, with
    /// the simulated cluster's CIDRs (pods 10.244.0.0/16 and fd44::/48,
    /// Services 10.96.0.0/16 and fd96::/108), in each node's namespace.
    pub fn program_kube_proxy(
        &self,
        mode: kube_proxy_fixture::Mode,
        services: &[kube_proxy_fixture::ServicePort],
    ) {
        for node in &self.nodes {
            let proxy = kube_proxy_fixture::KubeProxy {
                mode,
                cluster_cidr_v4: "10.244.0.0/16".into(),
                cluster_cidr_v6: "fd44::/48".into(),
                service_cidr_v4: "10.96.0.0/16".into(),
                service_cidr_v6: "fd96::/108".into(),
                node_addresses: vec![
                    IpAddr::V4(node.spec.address()),
                    IpAddr::V6(node.spec.address6()),
                ],
            };
            proxy
                .apply(&node.netns.name, services)
                .unwrap_or_else(|e| panic!("kube-proxy rules on {}: {e}", node.spec.name));
        }
    }

    pub fn node(&self, name: &str) -> &SimNode {
        self.nodes
            .iter()
            .find(|n| n.spec.name == name)
            .expect("node")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Agents stop and node namespaces go (their veths, routes, tc
        // filters and the programs' last references with them) first.
        self.nodes.clear();
        for entry in std::fs::read_dir(&self.bpffs)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
        let _ = nix::mount::umount2(&self.bpffs, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn specs(list: &[(&str, u8, Option<&str>)]) -> Vec<NodeSpec> {
    list.iter()
        .map(|(name, index, cidr)| NodeSpec {
            name: name.to_string(),
            index: *index,
            pod_cidr: cidr.map(str::to_string),
            dual_stack: false,
        })
        .collect()
}

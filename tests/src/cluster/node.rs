//! [`SimNode`]: one simulated node, its agent, and what its datapath,
//! routes and metrics say.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use flatnet_datapath::bpf::Datapath;
use serde_json::Value;

use super::{AGENT_READY, METRICS_PORT, NodeSpec, Peers, ROUTE_PROTO};
use crate::{Netns, POLL_INTERVAL, bin, bin_dir, enter, forwarded_datagrams, poll_until, run_ok};

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
    /// Its state (`remove_node_state`), removed should a signal end the
    /// process (`crate::remove_on_signal`).
    pub(super) listed: Option<crate::Listed>,
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
            Peers::Kubeconfig(path) => {
                cmd.args(["--peer-source", "kubernetes"])
                    .env("KUBECONFIG", path);
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
        let ready = poll_until(AGENT_READY, POLL_INTERVAL, || {
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

    /// True when the node has an interface called `name`.
    pub fn has_link(&self, name: &str) -> bool {
        self.netns
            .command(&["ip", "link", "show", name])
            .output()
            .expect("ip link")
            .status
            .success()
    }

    /// The fast path's remote CIDRs: "CIDR via NODE" routed directly,
    /// "CIDR vxlan NODE" tunnelled.
    pub fn remote_cidrs(&self) -> Vec<String> {
        let mut cidrs: Vec<String> = self
            .datapath()
            .remote_cidrs()
            .expect("remote CIDRs")
            .into_iter()
            .map(|entry| match entry.tunnelled {
                true => format!("{} vxlan {}", entry.cidr, entry.node),
                false => format!("{} via {}", entry.cidr, entry.node),
            })
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
        remove_node_state(&self.pin_root, &self.network);
        if let Some(listed) = self.listed.take() {
            listed.removed();
        }
    }
}

/// What node network `network` (pins under `pin_root`) keeps on the
/// machine: its pins, counter slots and hostPort records (the cluster's
/// bpffs goes after the nodes), and its files under /run/flatnet.
pub(super) fn remove_node_state(pin_root: &Path, network: &str) {
    let _ = Datapath::with_root(pin_root, network).remove_pins();
    for path in [
        flatnet_datapath::node::markers::ready_marker(network),
        flatnet_datapath::node::markers::managed_marker(network),
        PathBuf::from(format!("/run/flatnet/network-{network}.lock")),
        // An agent-managed network keeps these past its last DEL; the
        // node's namespace (and its nftables table) goes with the test.
        PathBuf::from(format!("/run/flatnet/masq-{network}")),
        // The agent's record of which policies select which pod.
        flatnet_datapath::node::markers::policy_names_file(network),
        // What the agent tells ADD of the namespaces' policies.
        flatnet_datapath::node::first_packet::isolation_file(network),
    ] {
        let _ = std::fs::remove_file(path);
    }
    // ADD's pod records (its pods' DELs took theirs).
    flatnet_datapath::node::first_packet::PodRecord::remove_all(network);
}

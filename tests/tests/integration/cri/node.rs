//! The CRI tests' node: the CNI dirs containerd reads, the agent's
//! conflist for a network of the test's own, containerd itself, and for a
//! simulated node its own network namespace; dropped, and checked gone.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use flatnet_agent::install::{ConflistSpec, render_conflist};
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::containerd::{Containerd, TOOLS, TestImages};
use flatnet_tests::cri::CriClient;
use flatnet_tests::*;
use serde_json::Value;

/// The reference plugins the bin dir holds next to flatnet's: loopback
/// (containerd's CRI sets up every sandbox's lo with it), the chained
/// ones, and the baseline network of the benchmark.
const REFERENCE: &[&str] = &["loopback", "portmap", "bandwidth", "host-local", "bridge"];

/// containerd, runc, busybox and the reference plugins.
pub(super) fn cri_tools() -> Vec<(String, &'static str)> {
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
pub(super) struct Node {
    pub(super) network: String,
    pub(super) bridge: String,
    pin_root: PathBuf,
    ipam_dir: PathBuf,
    pub(super) dir: PathBuf,
    /// "10.x.y" of the node's IPv4 pod CIDR.
    pub(super) prefix: String,
    pub(super) containerd: Option<Containerd>,
    /// The baseline network of the benchmark (bridge device, host-local dir).
    pub(super) baseline: Option<(String, PathBuf)>,
    /// This node's number in the process: its subnets and host ports.
    pub(super) index: u32,
    /// A simulated node's own network namespace; None: the test process's.
    /// Dropped after containerd (whose drop runs CNI DEL in it).
    pub(super) ns: Option<NodeNs>,
}

/// The network namespace of a simulated node: containerd runs in it, so
/// the plugins make the pods' host side there, and portmap and bandwidth
/// write their rules and qdiscs there, never in the test process's.
pub(super) struct NodeNs {
    pub(super) netns: Netns,
    /// At the other end of the node's `up0`: the rest of the cluster, a
    /// client from outside the node.
    pub(super) outside: Netns,
    /// The node's address (on `up0`, /24), what a hostPort is reached at.
    pub(super) address: Ipv4Addr,
}

impl NodeNs {
    pub(super) fn new(index: u32) -> Self {
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
    pub(super) fn new(dual_stack: bool) -> Self {
        Self::build(dual_stack, false)
    }

    /// A simulated node (its own network namespace, see [`NodeNs`]) with
    /// the agent's conflist as a node gets it: portmap and bandwidth
    /// chained after flatnet.
    pub(super) fn simulated() -> Self {
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
            map_sizing: Default::default(),
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

    pub(super) fn conf_dir(&self) -> PathBuf {
        self.dir.join("conf")
    }

    pub(super) fn write_conf(&self, name: &str, list: &Value) {
        std::fs::write(
            self.conf_dir().join(name),
            serde_json::to_vec_pretty(list).expect("JSON"),
        )
        .expect("write the conflist");
    }

    pub(super) fn containerd(&self) -> &Containerd {
        self.containerd.as_ref().expect("containerd")
    }

    pub(super) fn client(&self) -> CriClient {
        self.containerd()
            .client()
            .unwrap_or_else(|e| panic!("CRI client: {e:#}"))
    }

    pub(super) fn datapath(&self) -> Datapath {
        Datapath::with_root(&self.pin_root, &self.network)
    }

    pub(super) fn redirected_bytes(&self) -> u64 {
        self.datapath().stats().expect("STATS")[flatnet_common::action::REDIRECTED as usize].bytes
    }

    /// `ip` for the node's network namespace.
    pub(super) fn ip(&self) -> Command {
        let mut cmd = Command::new("ip");
        if let Some(ns) = &self.ns {
            cmd.args(["-n", &ns.netns.name]);
        }
        cmd
    }

    /// `args` run in the node's network namespace; its stdout.
    pub(super) fn exec(&self, args: &[&str]) -> String {
        match &self.ns {
            Some(ns) => ns.netns.exec(args),
            None => run_ok(Command::new(args[0]).args(&args[1..])),
        }
    }

    /// A link of the node's (host-side) namespace.
    pub(super) fn has_link(&self, name: &str) -> bool {
        match &self.ns {
            Some(_) => self
                .ip()
                .args(["link", "show", "dev", name])
                .output()
                .is_ok_and(|out| out.status.success()),
            None => link_exists(name),
        }
    }

    pub(super) fn wait_link_gone(&self, name: &str, timeout: Duration) -> bool {
        poll_until(timeout, POLL_INTERVAL, || !self.has_link(name))
    }

    pub(super) fn host_veth(&self, sandbox_id: &str) -> String {
        // containerd's CRI calls CNI with the sandbox ID and eth0.
        AttachmentNames::new(&self.network, sandbox_id, "eth0").host_veth
    }

    /// Addresses flatnet-ipam holds for this network.
    pub(super) fn allocations(&self) -> Vec<IpAddr> {
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

/// The test process's netfilter rules (host namespace).
pub(super) fn host_rules() -> String {
    format!(
        "{}{}",
        output(&mut Command::new("iptables-save")).unwrap_or_default(),
        output(Command::new("nft").args(["list", "ruleset"])).unwrap_or_default()
    )
}

/// Drops a simulated node and checks it took everything with it: its
/// namespaces, pins, and no rule of its network anywhere on the host.
pub(super) fn assert_node_gone(node: Node) {
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

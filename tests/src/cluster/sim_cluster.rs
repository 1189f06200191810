//! [`Cluster`]: the switch, the nodes on it and the test-owned bpffs, with
//! agents started on a peer file or an API stub.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use super::{NodeSpec, Peers, SimNode};
use crate::{Netns, run_ok, unique};

/// The switch, the nodes and the test-owned bpffs; all removed on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub bpffs: PathBuf,
    pub peer_file: PathBuf,
    pub nodes: Vec<SimNode>,
    pub _switch: Netns,
    /// The bpffs, unmounted should a signal end the process.
    listed: Option<crate::Listed>,
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
        let listed = Some(crate::mount_made(&bpffs, &dir));
        let switch = Netns::new();
        switch.exec(&["ip", "link", "add", "br0", "type", "bridge"]);
        switch.exec(&["ip", "link", "set", "br0", "up"]);
        let mut cluster = Cluster {
            peer_file: dir.join("peers.yaml"),
            dir: dir.clone(),
            bpffs: bpffs.clone(),
            nodes: Vec::new(),
            _switch: switch,
            listed,
        };
        let segments: std::collections::BTreeSet<u8> = specs.iter().map(|s| s.segment).collect();
        let routed = segments.len() > 1;
        if routed {
            // The switch namespace routes between its segments, one bridge
            // each: nodes on different segments share no L2.
            crate::forwarding::on_in(&cluster._switch);
            for segment in &segments {
                let bridge = segment_bridge(*segment);
                if *segment != 0 {
                    cluster
                        ._switch
                        .exec(&["ip", "link", "add", &bridge, "type", "bridge"]);
                    cluster._switch.exec(&["ip", "link", "set", &bridge, "up"]);
                }
                cluster._switch.exec(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("172.30.{segment}.254/24"),
                    "dev",
                    &bridge,
                ]);
                cluster._switch.exec(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("fd30:0:0:{segment:x}::fe/64"),
                    "dev",
                    &bridge,
                    "nodad",
                ]);
            }
        }
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
            cluster._switch.exec(&[
                "ip",
                "link",
                "set",
                &port,
                "master",
                &segment_bridge(spec.segment),
                "up",
            ]);
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
            if routed {
                // The other segments through the router.
                netns.exec(&[
                    "ip",
                    "route",
                    "add",
                    "172.30.0.0/16",
                    "via",
                    &format!("172.30.{}.254", spec.segment),
                ]);
                if spec.dual_stack {
                    netns.exec(&[
                        "ip",
                        "-6",
                        "route",
                        "add",
                        "fd30::/48",
                        "via",
                        &format!("fd30:0:0:{:x}::fe", spec.segment),
                    ]);
                }
            }
            let node_dir = dir.join(&spec.name);
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let (network, pin_root) = (format!("{id}-{}", spec.name), bpffs.join(&spec.name));
            let listed = {
                let (network, pin_root) = (network.clone(), pin_root.clone());
                crate::made_here(move || super::node::remove_node_state(&pin_root, &network))
            };
            cluster.nodes.push(SimNode {
                spec: spec.clone(),
                network,
                netns,
                pin_root,
                dir: node_dir,
                agent: Mutex::new(None),
                agent_flags: Vec::new(),
                plugin_stdin: Mutex::new(None),
                listed: Some(listed),
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
                segment: 0,
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
        self.program_kube_proxy_per_node(mode, |_| services.to_vec());
    }

    /// `program_kube_proxy` with each node's own view of the Services
    /// (`externalTrafficPolicy: Local`: which endpoints are the node's).
    pub fn program_kube_proxy_per_node(
        &self,
        mode: kube_proxy_fixture::Mode,
        services_of: impl Fn(&SimNode) -> Vec<kube_proxy_fixture::ServicePort>,
    ) {
        for node in &self.nodes {
            let services = services_of(node);
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
                .apply(&node.netns.name, &services)
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

/// The switch's bridge of underlay segment `segment`.
fn segment_bridge(segment: u8) -> String {
    format!("br{segment}")
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
        if let Some(listed) = self.listed.take() {
            listed.removed();
        }
    }
}

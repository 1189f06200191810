//! A whole cluster, brought up as an operator would and torn down so that
//! nothing of it is left: the control plane, the nodes (NotReady), then
//! flatnet deployed from the project's own manifests (ServiceAccount, RBAC,
//! ConfigMap, DaemonSet with the image built here), which makes the nodes
//! Ready, then cluster DNS, and kube-proxy on each node unless its
//! Services are flatnet's (`--services ebpf`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::build::Built;
use super::control_plane::ControlPlane;
use super::node::Node;
use super::pki::Pki;
use super::plan::{self, Plan};

/// Who load-balances Services in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServicesMode {
    /// kube-proxy (iptables) on every node, flatnet hands its flows to the stack.
    KubeProxy,
    /// kube-proxy in its nftables mode (GA since 1.33) on every node.
    KubeProxyNftables,
    /// No kube-proxy: flatnet-agent `--services ebpf` balances ClusterIPs
    /// at the socket.
    Ebpf,
}

impl ServicesMode {
    pub fn name(self) -> &'static str {
        match self {
            ServicesMode::KubeProxy => "kube-proxy",
            ServicesMode::KubeProxyNftables => "kube-proxy-nftables",
            ServicesMode::Ebpf => "ebpf",
        }
    }

    /// A run's name: the mode, and the families when both.
    pub fn run_name(self, dual_stack: bool) -> String {
        if dual_stack {
            format!("{}-dual-stack", self.name())
        } else {
            self.name().to_string()
        }
    }

    /// Every mode, in the order runs take them.
    pub const ALL: [ServicesMode; 3] = [
        ServicesMode::KubeProxy,
        ServicesMode::KubeProxyNftables,
        ServicesMode::Ebpf,
    ];

    /// kube-proxy's `mode` when it runs.
    pub fn kube_proxy_mode(self) -> Option<&'static str> {
        match self {
            ServicesMode::KubeProxy => Some("iptables"),
            ServicesMode::KubeProxyNftables => Some("nftables"),
            ServicesMode::Ebpf => None,
        }
    }
}

const SERVICE_ACCOUNT: &str = include_str!("../../deploy/kubernetes/serviceaccount.yaml");
const RBAC: &str = include_str!("../../deploy/kubernetes/rbac.yaml");
const CONFIG_MAP: &str = include_str!("../../deploy/kubernetes/configmap.yaml");
const DAEMON_SET: &str = include_str!("../../deploy/kubernetes/daemonset.yaml");
const CLUSTER_DNS: &str = include_str!("../../deploy/e2e/cluster-dns.yaml");

pub struct Cluster {
    pub plan: Plan,
    pub mode: ServicesMode,
    // Dropped in this order: nodes first (their pods' DELs need nothing of
    // the control plane), then the control plane.
    pub nodes: Vec<Node>,
    pub control_plane: ControlPlane,
}

impl Cluster {
    /// Brings the cluster up; `images` are imported on every node.
    pub fn up(
        plan: Plan,
        mode: ServicesMode,
        built: &Built,
        images: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let dir = plan.dir.clone();
        let cluster = Self::start(plan, mode, built, images);
        if cluster.is_err() {
            // What had started is down by now; its state folder goes too,
            // as after a run (a CI run that failed here left 764 MB).
            let _ = std::fs::remove_dir_all(&dir);
        }
        cluster
    }

    fn start(
        plan: Plan,
        mode: ServicesMode,
        built: &Built,
        images: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        let pki = Pki::create(&plan.dir.join("pki"))?;
        let control_plane = ControlPlane::start(&plan, &pki, &built.bin_dir, &built.etcd())?;
        println!(
            "e2e: control plane ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        // flatnet's objects go in before any node: an operator applies the
        // DaemonSet, and each node gets its agent as it joins.
        deploy_flatnet(&control_plane, mode)?;
        // The nodes come up side by side (each imports ~600 MB of images).
        let started_nodes: Vec<anyhow::Result<Node>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (1..=plan.nodes)
                .map(|index| {
                    let (plan, control_plane, pki) = (&plan, &control_plane, &pki);
                    scope.spawn(move || {
                        let mut node =
                            Node::start(plan, index, &control_plane.host, pki, built, images)?;
                        // kube-proxy comes with the node, before its CNI
                        // (kubeadm's DaemonSet runs on the host network):
                        // the agent reaches the API server through the
                        // `kubernetes` Service it translates.
                        if let Some(proxy_mode) = mode.kube_proxy_mode() {
                            node.start_kube_proxy(&built.bin_dir, proxy_mode)?;
                        }
                        Ok(node)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a node's start panicked")))
                })
                .collect()
        });
        // Every node that started is kept (and so torn down on an error).
        let mut nodes = Vec::new();
        let mut failed = None;
        for node in started_nodes {
            match node {
                Ok(node) => nodes.push(node),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            drop(nodes);
            return Err(e);
        }
        let mut cluster = Cluster {
            plan,
            mode,
            nodes,
            control_plane,
        };
        println!(
            "e2e: {} kubelets running in {:.1} s",
            cluster.nodes.len(),
            started.elapsed().as_secs_f64()
        );
        cluster.route_pod_cidrs()?;
        cluster.wait_ready(Duration::from_secs(180))?;
        println!(
            "e2e: nodes Ready (flatnet-agent running on each) in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        cluster.control_plane.apply(CLUSTER_DNS)?;
        cluster.rollout("deployment/flatnet-cluster-dns", Duration::from_secs(120))?;
        println!(
            "e2e: cluster ({} Services) up in {:.1} s",
            mode.name(),
            started.elapsed().as_secs_f64()
        );
        Ok(cluster)
    }

    /// Waits for kube-controller-manager to give every node its pod CIDRs
    /// (one per family) and routes each on the control plane machine via
    /// the node's address of that family (host-gw, as flatnet's agents
    /// route them between the nodes).
    fn route_pod_cidrs(&self) -> anyhow::Result<()> {
        let families = if self.plan.dual_stack { 2 } else { 1 };
        for node in &self.nodes {
            let mut cidrs = Vec::new();
            self.control_plane.wait_for(
                Duration::from_secs(60),
                "a pod CIDR of each family for each node",
                || {
                    cidrs = self
                        .control_plane
                        .kubectl(&[
                            "get",
                            "node",
                            &node.name,
                            "-o",
                            "jsonpath={.spec.podCIDRs[*]}",
                        ])
                        .unwrap_or_default()
                        .split_whitespace()
                        .map(str::to_string)
                        .collect();
                    cidrs.len() == families
                },
            )?;
            for cidr in &cidrs {
                let ipv6 = cidr.contains(':');
                let via = self
                    .plan
                    .node_addresses(node.index)
                    .into_iter()
                    .find(|a| a.is_ipv6() == ipv6)
                    .with_context(|| format!("no address of {cidr}'s family on {}", node.name))?;
                self.control_plane.route_pods(cidr, &via)?;
            }
        }
        Ok(())
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            for node in &mut self.nodes {
                node.check()?;
            }
            self.control_plane.check()?;
            let ready = self
                .control_plane
                .kubectl(&[
                    "get",
                    "nodes",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
                ])
                .unwrap_or_default();
            let ready_nodes = ready.lines().filter(|l| l.ends_with("=True")).count();
            if ready_nodes == self.nodes.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "nodes not Ready after {timeout:?}:\n{ready}\nflatnet-agent pods:\n{}",
                    self.control_plane
                        .kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"])
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `kubectl rollout status` of a kube-system workload.
    pub fn rollout(&self, what: &str, timeout: Duration) -> anyhow::Result<()> {
        self.control_plane
            .kubectl(&[
                "-n",
                "kube-system",
                "rollout",
                "status",
                what,
                &format!("--timeout={}s", timeout.as_secs()),
            ])
            .with_context(|| {
                format!(
                    "{what} did not roll out; kube-system:\n{}",
                    self.control_plane
                        .kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"])
                        .unwrap_or_default()
                )
            })?;
        Ok(())
    }

    /// The run's name: its Services mode, and the families when both.
    pub fn name(&self) -> String {
        self.mode.run_name(self.plan.dual_stack)
    }

    /// Every daemon of the cluster still running.
    pub fn check(&mut self) -> anyhow::Result<()> {
        self.control_plane.check()?;
        for node in &mut self.nodes {
            node.check()?;
        }
        Ok(())
    }

    pub fn logs(&self) -> &Path {
        &self.plan.logs
    }

    /// Stops everything; the run's state folder goes with it.
    pub fn down(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        // Pods' logs and the agents' are kept with the run's logs.
        for node in &self.nodes {
            let _ = copy_tree(
                &node.host.dir.join("root/var/log/pods"),
                &node.logs().join("pods"),
            );
        }
        while let Some(mut node) = self.nodes.pop() {
            node.stop();
        }
        self.control_plane.stop();
        let _ = std::fs::remove_dir_all(&self.plan.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// flatnet as a user deploys it: the four manifests, then what this
/// cluster needs changed the way an operator would change it.
fn deploy_flatnet(control_plane: &ControlPlane, mode: ServicesMode) -> anyhow::Result<()> {
    for manifest in [SERVICE_ACCOUNT, RBAC, CONFIG_MAP, DAEMON_SET] {
        control_plane.apply(manifest)?;
    }
    if mode == ServicesMode::Ebpf {
        control_plane.kubectl(&[
            "-n",
            "kube-system",
            "patch",
            "configmap",
            "flatnet-config",
            "--type=merge",
            "-p",
            r#"{"data":{"FLATNET_SERVICES":"ebpf"}}"#,
        ])?;
        // Without kube-proxy nothing translates the `kubernetes` Service
        // for the agent before the agent itself does: it is given the API
        // server's own address (as Cilium's k8sServiceHost). The socket
        // programs go on the node's own cgroup subtree (kubelet's
        // cgroupRoot here: both nodes share this machine's cgroup tree).
        control_plane.kubectl(&[
            "-n",
            "kube-system",
            "set",
            "env",
            "daemonset/flatnet-agent",
            &format!("KUBERNETES_SERVICE_HOST={}", plan::CONTROL_PLANE_ADDRESS),
            &format!("KUBERNETES_SERVICE_PORT={}", plan::API_PORT),
            "FLATNET_SERVICES_CGROUP=/host/cgroup/unified/$(NODE_NAME)",
        ])?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    if !from.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        } else if kind.is_symlink() {
            // /var/log/containers' links point into /var/log/pods.
            if let Ok(resolved) = std::fs::canonicalize(entry.path()) {
                let _ = std::fs::copy(resolved, &target);
            }
        }
    }
    Ok(())
}

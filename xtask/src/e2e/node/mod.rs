//! A worker node: containerd 2 with its CRI plugin, kubelet and (in
//! `--services kube-proxy` runs) kube-proxy, on a machine of its own
//! (`host.rs`), plugged into the control plane's bridge. flatnet is not
//! started here: its agent arrives as the DaemonSet's pod, as on a real
//! cluster, and until then the node is NotReady (no CNI configuration).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

mod config;

pub(crate) use config::containerd_config;

use super::build::Built;
use super::cgroups::{cgroup_hierarchies, remove_cgroup_tree};
use super::daemon::Daemon;
use super::host::Host;
use super::pki::Pki;
use super::plan::{self, Plan};

/// Global sysctls kubelet writes (setupKernelTunables): saved before
/// and restored after a run by `sysctls.rs`.
pub const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

pub struct Node {
    pub index: u8,
    pub name: String,
    pub address: Ipv4Addr,
    /// Every address of the node, IPv4 first (IPv6 too on dual-stack).
    pub addresses: Vec<IpAddr>,
    pub host: Host,
    /// `topology.kubernetes.io/zone` (kubelet labels its node).
    pub zone: String,
    /// kubelet's cgroupRoot: the node's own subtree of every hierarchy.
    pub cgroup_root: String,
    containerd: Option<Daemon>,
    kubelet: Option<Daemon>,
    kube_proxy: Option<Daemon>,
    logs: PathBuf,
}

impl Node {
    /// Makes the machine, plugs it into the bridge, and starts containerd
    /// (with the images imported) and kubelet.
    pub fn start(
        plan: &Plan,
        index: u8,
        control_plane: &Host,
        pki: &Pki,
        built: &Built,
        images: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let name = plan.node_name(index);
        let address = plan.node_address(index);
        let host = Host::create(&name, &plan.dir.join(&name))?;
        let logs = plan.logs.join(&name);
        std::fs::create_dir_all(&logs)?;
        let mut node = Node {
            index,
            cgroup_root: format!("/{name}"),
            name,
            address,
            addresses: plan.node_addresses(index),
            zone: plan.zone(index),
            host,
            containerd: None,
            kubelet: None,
            kube_proxy: None,
            logs,
        };
        node.plug_in(plan, control_plane)?;
        node.make_cgroup_root()?;
        node.write_configuration(plan, pki, built)?;
        node.start_containerd(built, images)?;
        node.start_kubelet(&built.bin_dir)?;
        Ok(node)
    }

    /// The node's `eth0` on the control plane's bridge; routes to the
    /// Services' ranges through it (kube-proxy translates on the way out,
    /// but a route must exist for the first lookup). No default route.
    fn plug_in(&self, plan: &Plan, control_plane: &Host) -> anyhow::Result<()> {
        let port = format!("{}-n{}", plan::PREFIX, self.index);
        let node_pid = self.host.pid().to_string();
        control_plane
            .run(
                "ip",
                &[
                    "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                    &node_pid,
                ],
            )
            .context("plugging a node into the bridge")?;
        control_plane.run(
            "sh",
            &[
                "-euc",
                &format!(
                    "ip link set {port} master {bridge} && ip link set {port} up",
                    bridge = plan::BRIDGE
                ),
            ],
        )?;
        // IPv6 without duplicate address detection (our own segment): a
        // tentative address would fail kubelet's first binds.
        let ipv6 = match self.addresses.get(1) {
            Some(address6) if plan.dual_stack => format!(
                "ip addr add {address6}/{prefix} dev eth0 nodad
                 ip -6 route add {services} dev eth0",
                prefix = plan::UNDERLAY6_PREFIX,
                services = plan::SERVICE_CIDR6,
            ),
            _ => String::new(),
        };
        self.host.run(
            "sh",
            &[
                "-euc",
                &format!(
                    "ip link set lo up
                     ip addr add {address}/{prefix} dev eth0
                     ip link set eth0 up
                     ip route add {services} dev eth0
                     {ipv6}",
                    address = self.address,
                    prefix = plan::UNDERLAY_PREFIX,
                    services = plan::SERVICE_CIDR,
                ),
            ],
        )?;
        Ok(())
    }

    /// kubelet checks that its cgroupRoot exists in every hierarchy; the
    /// cpuset one needs its CPUs and memory nodes before anything joins it.
    fn make_cgroup_root(&self) -> anyhow::Result<()> {
        for hierarchy in cgroup_hierarchies()? {
            let dir = hierarchy.join(self.cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if hierarchy.ends_with("cpuset") {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = std::fs::read_to_string(hierarchy.join(file))?;
                    std::fs::write(dir.join(file), value.trim())
                        .with_context(|| format!("writing {}", dir.join(file).display()))?;
                }
            }
        }
        Ok(())
    }

    fn start_containerd(&mut self, built: &Built, images: &[PathBuf]) -> anyhow::Result<()> {
        let mut cmd = self.host.command(built.containerd());
        cmd.args(["--config", "/etc/containerd/config.toml"])
            // Its shim (containerd-shim-runc-v2) is found on PATH.
            .env("PATH", path_with(&built.bin_dir));
        let mut daemon = Daemon::start(&self.host, "containerd", cmd, &self.logs)?;
        let ctr = built.ctr().display().to_string();
        daemon.wait_ready(Duration::from_secs(30), "its socket", || {
            self.host
                .run(&ctr, &["--address", SOCKET, "version"])
                .is_ok()
        })?;
        self.containerd = Some(daemon);
        for image in images {
            self.host
                .run(
                    &ctr,
                    &[
                        "--address",
                        SOCKET,
                        "-n",
                        "k8s.io",
                        "images",
                        "import",
                        &image.display().to_string(),
                    ],
                )
                .with_context(|| format!("importing {} on {}", image.display(), self.name))?;
        }
        Ok(())
    }

    fn start_kubelet(&mut self, bin: &Path) -> anyhow::Result<()> {
        // kubeadm's kubelet.service restarts kubelet whenever it exits
        // (Restart=always): kubelet exits 255 on a fatal error at start
        // and relies on that. The node does the same, a few times, with the
        // log of each exit printed; an exit after start stays an error.
        let mut attempt = 1;
        loop {
            let mut cmd = self.host.command(bin.join("kubelet"));
            cmd.args([
                "--config=/etc/kubernetes/kubelet.yaml",
                "--kubeconfig=/etc/kubernetes/kubelet.kubeconfig",
                &format!("--hostname-override={}", self.name),
                &format!("--node-ip={}", self.node_ips()),
                &format!("--node-labels=topology.kubernetes.io/zone={}", self.zone),
                "--v=1",
            ])
            // Old kubelets' in-tree ECR credential provider asked the EC2
            // metadata address at start; any AWS SDK in it is told not to.
            .env("AWS_EC2_METADATA_DISABLED", "true");
            let mut daemon = Daemon::start(&self.host, "kubelet", cmd, &self.logs)?;
            let started = daemon.wait_ready(Duration::from_secs(60), "healthz", || {
                self.host
                    .run("curl", &["-sf", "http://127.0.0.1:10248/healthz"])
                    .is_ok()
            });
            match started {
                Ok(()) => {
                    self.kubelet = Some(daemon);
                    return Ok(());
                }
                Err(e) if attempt < KUBELET_STARTS && daemon.exited().is_some() => {
                    println!(
                        "e2e: {}: {e:#}\ne2e: starting kubelet again, as its systemd unit would",
                        self.name
                    );
                    attempt += 1;
                    std::thread::sleep(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// kubelet's `--node-ip`: the node's addresses, comma-separated.
    fn node_ips(&self) -> String {
        let ips: Vec<String> = self.addresses.iter().map(IpAddr::to_string).collect();
        ips.join(",")
    }

    /// kube-proxy in `mode` (iptables or nftables).
    pub fn start_kube_proxy(&mut self, bin: &Path, mode: &str) -> anyhow::Result<()> {
        let mut cmd = self.host.command(bin.join("kube-proxy"));
        cmd.arg(format!("--config=/etc/kubernetes/kube-proxy-{mode}.yaml"))
            .arg("--v=1");
        let mut daemon = Daemon::start(&self.host, "kube-proxy", cmd, &self.logs)?;
        let healthz = format!("http://{}:10256/healthz", self.address);
        daemon.wait_ready(Duration::from_secs(60), "healthz", || {
            self.host.run("curl", &["-sf", &healthz]).is_ok()
        })?;
        self.kube_proxy = Some(daemon);
        Ok(())
    }

    /// Every daemon of the node still running.
    pub fn check(&mut self) -> anyhow::Result<()> {
        for daemon in [
            &mut self.containerd,
            &mut self.kubelet,
            &mut self.kube_proxy,
        ]
        .into_iter()
        .flatten()
        {
            daemon.check()?;
        }
        Ok(())
    }

    /// Stops the daemons, kills what is left on the machine (shims and
    /// containers), removes the node's cgroups and its machine.
    pub fn stop(&mut self) {
        for daemon in [
            &mut self.kube_proxy,
            &mut self.kubelet,
            &mut self.containerd,
        ] {
            if let Some(mut daemon) = daemon.take() {
                daemon.stop();
            }
        }
        self.host.shut_down();
        remove_cgroup_tree(&self.cgroup_root);
    }

    pub fn logs(&self) -> &Path {
        &self.logs
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How many times kubelet is started before its exits at start fail the
/// run.
const KUBELET_STARTS: u32 = 3;

pub const SOCKET: &str = "/run/containerd/containerd.sock";

/// PATH with `dir` first.
fn path_with(dir: &Path) -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path)))
        .unwrap_or(path)
}

//! The machine critest runs on: a network, mount and UTS namespace of its
//! own (`e2e::host::Host`: private /run, /etc/cni/net.d, /opt/cni/bin,
//! /var/lib/containerd, ... and here /tmp too), with containerd 2 at its
//! default paths in it, flatnet (and the reference portmap and loopback)
//! as its CNI, and the registry critest pulls from on its loopback.
//! Hostnetwork pods, hostPorts, portmap's rules, critest's mounts and
//! temporary folders all stay inside it.
//!
//! Taking it down: every sandbox stopped and removed through CRI (so each
//! CNI DEL runs, and flatnet's pins go with the last), then containerd,
//! the registry and every process of the machine, its network namespace,
//! its folder, and the cgroups its containers left. The same by name
//! (without CRI when containerd is gone) on a signal or for what a killed
//! run left.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use super::super::build::Built;
use super::super::daemon::Daemon;
use super::super::host::{self, Host};
use super::registry;
use flatnet_harness::containerd::{ContainerdConfig, Cri};

/// The machine's name (its network namespace, its hostname).
pub const NAME: &str = "flatnet-critest";
/// Its state (removed after each run).
pub const STATE_DIR: &str = "/var/tmp/flatnet-critest";
/// The CRI socket, inside the machine.
pub const SOCKET: &str = "/run/containerd/containerd.sock";
/// The pod network: a name and a subnet no other test of the project uses.
pub const NETWORK: &str = "flatnet-critest";
pub const SUBNET: &str = "10.88.77.0/24";
const GATEWAY: &str = "10.88.77.1";
const BRIDGE: &str = "flcritest0";

/// The conflist: flatnet (with flatnet-ipam) and the reference portmap
/// for the CRI's port mappings.
pub fn conflist() -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "cniVersions": ["1.0.0", "1.1.0"],
  "name": "{NETWORK}",
  "plugins": [
    {{
      "type": "flatnet",
      "capabilities": {{"mtu": true, "mac": true, "ips": true, "bandwidth": true}},
      "bridge": "{BRIDGE}",
      "mtu": 1500,
      "datapath": "tc",
      "ipam": {{
        "type": "flatnet-ipam",
        "ranges": [[{{"subnet": "{SUBNET}", "gateway": "{GATEWAY}"}}]],
        "dataDir": "/var/lib/cni/flatnet-ipam"
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}, "snat": true}}
  ]
}}
"#
    )
}

pub struct Machine {
    pub host: Host,
    pub logs: PathBuf,
    crictl: PathBuf,
    containerd: Option<Daemon>,
    registry: Option<Daemon>,
    /// The cgroup `k8s.io` folders (containerd's default parent) absent
    /// before: removed again when empty.
    made_cgroups: Vec<PathBuf>,
}

/// The `k8s.io` folder of every cgroup hierarchy.
fn k8s_cgroups() -> Vec<PathBuf> {
    super::super::node::cgroup_hierarchies()
        .unwrap_or_default()
        .into_iter()
        .map(|h| h.join("k8s.io"))
        .collect()
}

impl Machine {
    /// Makes the machine and writes its CNI and containerd configuration.
    pub fn create(built: &Built, plugins: &[PathBuf], logs: &Path) -> anyhow::Result<Self> {
        clean_up(&built.bin("crictl"));
        std::fs::create_dir_all(logs)?;
        let made_cgroups = k8s_cgroups().into_iter().filter(|p| !p.exists()).collect();
        let host = Host::create(NAME, &Path::new(STATE_DIR).join(NAME))?;
        let machine = Machine {
            host,
            logs: logs.to_path_buf(),
            crictl: built.bin("crictl"),
            containerd: None,
            registry: None,
            made_cgroups,
        };
        let tmp = machine.host.dir.join("tmp");
        std::fs::create_dir_all(&tmp)?;
        machine.host.run(
            "sh",
            &[
                "-euc",
                &format!(
                    "ip link set lo up; chmod 1777 '{tmp}'; mount --bind '{tmp}' /tmp",
                    tmp = tmp.display()
                ),
            ],
        )?;
        let root = machine.host.dir.join("root");
        let bin = root.join("opt/cni/bin");
        for plugin in plugins {
            let name = plugin.file_name().context("a plugin without a name")?;
            std::fs::copy(plugin, bin.join(name))
                .with_context(|| format!("cannot copy {}", plugin.display()))?;
        }
        std::fs::write(
            root.join("etc/cni/net.d/10-flatnet-critest.conflist"),
            conflist(),
        )?;
        let config = ContainerdConfig {
            paths: None,
            cri: Some(Cri {
                sandbox_image: crate::e2e::images::PAUSE.to_string(),
                cni_bin_dir: "/opt/cni/bin".into(),
                cni_conf_dir: "/etc/cni/net.d".into(),
                runc: None,
                registry_config_path: Some("/etc/containerd/certs.d".into()),
            }),
        }
        .to_toml_v3(&built.bin("containerd-shim-runc-v2"));
        std::fs::write(root.join("etc/containerd/config.toml"), config)?;
        registry::write_certs_d(&root.join("etc/containerd/certs.d"))?;
        Ok(machine)
    }

    /// Starts the registry (blobs in the machine's folder) and pushes
    /// `images` (archive, names) into it.
    pub fn serve_images(
        &mut self,
        crane: &Path,
        images: &[(Vec<String>, PathBuf)],
    ) -> anyhow::Result<()> {
        let blobs = self.host.dir.join("registry");
        std::fs::create_dir_all(&blobs)?;
        self.registry = Some(registry::start(&self.host, crane, &blobs, &self.logs)?);
        for (names, archive) in images {
            registry::push(&self.host, crane, archive, names)?;
        }
        Ok(())
    }

    /// Starts containerd and waits for its CRI to say the runtime and the
    /// network are ready.
    pub fn start_containerd(&mut self, built: &Built) -> anyhow::Result<()> {
        let mut cmd = self.host.command(built.containerd());
        cmd.args(["--config", "/etc/containerd/config.toml"]);
        let mut daemon = Daemon::start(&self.host, "containerd", cmd, &self.logs)?;
        let crictl = self.crictl.display().to_string();
        let endpoint = format!("unix://{SOCKET}");
        daemon.wait_ready(Duration::from_secs(60), "CRI's NetworkReady", || {
            self.host
                .run(&crictl, &["--runtime-endpoint", &endpoint, "info"])
                .is_ok_and(|info| {
                    info.contains("\"NetworkReady\"") && !info.contains("\"status\": false")
                })
        })?;
        self.containerd = Some(daemon);
        Ok(())
    }

    /// An error when containerd or the registry died meanwhile.
    pub fn check(&mut self) -> anyhow::Result<()> {
        for daemon in self.containerd.iter_mut().chain(self.registry.iter_mut()) {
            daemon.check()?;
        }
        Ok(())
    }

    /// Takes the machine down (see the module's doc); what CRI's removal
    /// left of the pod network (flatnet's pins and devices, addresses in
    /// flatnet-ipam's store) is returned.
    pub fn tear_down(mut self) -> Vec<String> {
        let mut left = Vec::new();
        if self.containerd.is_some() {
            if let Err(e) = remove_sandboxes(&self.host, &self.crictl) {
                left.push(format!("removing the sandboxes through CRI: {e:#}"));
            }
            left.extend(self.network_leftovers());
        }
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop();
        }
        if let Some(mut registry) = self.registry.take() {
            registry.stop();
        }
        self.host.shut_down();
        remove_state(&self.made_cgroups);
        left
    }

    /// flatnet's pins, host veths and bridge, and flatnet-ipam's records
    /// still on the machine.
    fn network_leftovers(&self) -> Vec<String> {
        let script = format!(
            "ls /sys/fs/bpf/flatnet/{NETWORK} 2>/dev/null | sed 's/^/pin /'
             ip -o link show | awk -F': ' '{{print $2}}' | grep -E '^(fl|{BRIDGE})' | sed 's/^/link /'
             ls /var/lib/cni/flatnet-ipam/{NETWORK} 2>/dev/null | grep -v -E '^(lock|last_reserved)' | sed 's/^/address /'
             true"
        );
        match self.host.run("sh", &["-c", &script]) {
            Ok(found) => found
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| format!("{l} (after every sandbox was removed)"))
                .collect(),
            Err(e) => vec![format!("cannot look for the network's leftovers: {e:#}")],
        }
    }
}

/// Every sandbox stopped and removed through CRI (CNI DEL for each).
fn remove_sandboxes(host: &Host, crictl: &Path) -> anyhow::Result<()> {
    let crictl = crictl.display().to_string();
    let endpoint = format!("unix://{SOCKET}");
    host.run(
        &crictl,
        &[
            "--runtime-endpoint",
            &endpoint,
            "--timeout",
            "60s",
            "rmp",
            "--all",
            "--force",
        ],
    )?;
    let left = host.run(&crictl, &["--runtime-endpoint", &endpoint, "pods", "-q"])?;
    if !left.trim().is_empty() {
        bail!("sandboxes left after crictl rmp: {}", left.trim());
    }
    Ok(())
}

/// What a machine of an earlier (killed) run left, or this one's on a
/// signal: its sandboxes removed through CRI while its containerd still
/// answers, then its processes, network namespace, folder and cgroups.
pub fn clean_up(crictl: &Path) {
    let netns = Path::new("/run/netns").join(NAME);
    if !netns.exists() {
        let _ = std::fs::remove_dir_all(STATE_DIR);
        return;
    }
    println!("critest: taking down {NAME}, left by an earlier run");
    let inode = nix::sys::stat::stat(&netns).map(|s| s.st_ino).unwrap_or(0);
    let net = PathBuf::from(format!("net:[{inode}]"));
    // Any process of the machine (the namespace holder is one) lets
    // crictl in through nsenter.
    let member = members("net", &net).into_iter().next();
    if let Some(pid) = member {
        let _ = Command::new("timeout")
            .args([
                "90",
                "nsenter",
                "--target",
                &pid.to_string(),
                "--mount",
                "--uts",
                "--net",
                "--",
            ])
            .arg(crictl)
            .args([
                "--runtime-endpoint",
                &format!("unix://{SOCKET}"),
                "rmp",
                "--all",
                "--force",
            ])
            .output();
        if let Ok(mnt) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) {
            host::kill_mount_namespace(&mnt);
        }
    }
    host::kill_namespace_members("net", &net);
    let _ = Command::new("ip").args(["netns", "delete", NAME]).output();
    host::remove_made_mount_points(&Path::new(STATE_DIR).join(NAME));
    remove_state(&[]);
}

/// Pids whose `kind` namespace is `ns`.
fn members(kind: &str, ns: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
                .ok()
                .as_deref()
                == Some(ns)
        })
        .collect()
}

/// The cgroups of the machine's containers (named by the runc state it
/// kept), the `k8s.io` folders this run made, and the state folder.
fn remove_state(made_cgroups: &[PathBuf]) {
    let runc = Path::new(STATE_DIR)
        .join(NAME)
        .join("root/run/containerd/runc/k8s.io");
    let ids: Vec<String> = std::fs::read_dir(&runc)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for parent in k8s_cgroups() {
        for id in &ids {
            let _ = std::fs::remove_dir(parent.join(id));
        }
    }
    for made in made_cgroups {
        let _ = std::fs::remove_dir(made);
    }
    let _ = std::fs::remove_dir_all(STATE_DIR);
}

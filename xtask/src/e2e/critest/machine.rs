//! The machine critest runs on: a network, mount, UTS and IPC namespace
//! of its own (`e2e::host::Host`: private /run, /etc/cni/net.d, /opt/cni/bin,
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
use super::super::host::Host;
use super::cleanup::{k8s_cgroups, remove_state};
use super::names::{CNI_LOG, NAME, SOCKET, STATE_DIR};
use super::registry;

/// The pod network: a name and a subnet no other test of the project uses.
pub const NETWORK: &str = "flatnet-critest";
pub const SUBNET: &str = "10.88.77.0/24";
const GATEWAY: &str = "10.88.77.1";
const BRIDGE: &str = "flcritest0";

/// The conflist: flatnet (with flatnet-ipam) and the reference portmap
/// (plugins 1.10.0, built with the release: Debian's 1.1.1 does not know
/// STATUS) for the CRI's port mappings, at CNI 1.1.0, so containerd 2 asks
/// STATUS and GC as it would of a node's conflist. flatnet writes a line
/// per invocation to `logFile` (runtime_cni.rs reads it).
pub fn conflist() -> String {
    format!(
        r#"{{
  "cniVersion": "1.1.0",
  "name": "{NETWORK}",
  "plugins": [
    {{
      "type": "flatnet",
      "logFile": "{log}",
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
"#,
        log = CNI_LOG,
    )
}

pub struct Machine {
    pub host: Host,
    /// A process of the machine in an IPC namespace of its own, which
    /// containerd and critest enter: critest's HostIpc specs make a shared
    /// memory segment "on the host" (`ipcmk`) and never remove it.
    ipc_holder: std::process::Child,
    pub logs: PathBuf,
    crictl: PathBuf,
    containerd: Option<Daemon>,
    registry: Option<Daemon>,
    /// The cgroup `k8s.io` folders (containerd's default parent) absent
    /// before: removed again when empty.
    made_cgroups: Vec<PathBuf>,
}

impl Machine {
    /// Makes the machine and writes its CNI and containerd configuration.
    pub fn create(built: &Built, plugins: &[PathBuf], logs: &Path) -> anyhow::Result<Self> {
        super::cleanup::clean_up(&built.bin("crictl"));
        std::fs::create_dir_all(logs)?;
        let made_cgroups = k8s_cgroups().into_iter().filter(|p| !p.exists()).collect();
        let host = Host::create(NAME, &Path::new(STATE_DIR).join(NAME))?;
        let mut holder = host.command("unshare");
        holder
            .args(["--ipc", "sleep", "infinity"])
            .stdin(std::process::Stdio::null());
        let ipc_holder = holder
            .spawn()
            .context("cannot start the holder of the machine's IPC namespace (unshare)")?;
        let machine = Machine {
            host,
            ipc_holder,
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
        let config = crate::e2e::node::containerd_config(&built.bin("containerd-shim-runc-v2"));
        std::fs::write(root.join("etc/containerd/config.toml"), config)?;
        registry::write_certs_d(&root.join("etc/containerd/certs.d"))?;
        Ok(machine)
    }

    /// `program` entered into the machine's namespaces and its IPC one.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["--target", &self.ipc_holder.id().to_string()])
            .args(["--mount", "--uts", "--net", "--ipc", "--"])
            .arg(program);
        cmd
    }

    /// Waits until the IPC holder has its namespace (unshare has run).
    fn wait_for_ipc_namespace(&self) -> anyhow::Result<()> {
        let pid = self.ipc_holder.id();
        let own = std::fs::read_link("/proc/self/ns/ipc")?;
        for _ in 0..200 {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let ipc = std::fs::read_link(format!("/proc/{pid}/ns/ipc")).unwrap_or_default();
            if exe.ends_with("sleep") && ipc != own {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("the machine's IPC namespace holder (pid {pid}) did not start")
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
        self.wait_for_ipc_namespace()?;
        let mut cmd = self.command(built.containerd());
        cmd.args(["--config", "/etc/containerd/config.toml"]);
        let mut daemon = Daemon::start(&self.host, "containerd", cmd, &self.logs)?;
        let crictl = self.crictl.display().to_string();
        let endpoint = format!("unix://{SOCKET}");
        let last = std::cell::RefCell::new(String::from("no answer"));
        let ready = daemon.wait_ready(Duration::from_secs(60), "CRI's NetworkReady", || match self
            .host
            .run(
                &crictl,
                &["--runtime-endpoint", &endpoint, "info", "-o", "json"],
            ) {
            Ok(info) => {
                let ready = cri_ready(&info);
                *last.borrow_mut() = info;
                ready
            }
            Err(e) => {
                *last.borrow_mut() = format!("{e:#}");
                false
            }
        });
        if let Err(e) = ready {
            bail!("{e:#}\ncrictl info said: {}", last.borrow());
        }
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
        let _ = self.ipc_holder.kill();
        let _ = self.ipc_holder.wait();
        remove_state(&self.made_cgroups);
        left
    }

    /// flatnet's pins, host veths and bridge, and flatnet-ipam's records
    /// still on the machine.
    pub(super) fn network_leftovers(&self) -> Vec<String> {
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

/// Whether `crictl info -o json` says RuntimeReady and NetworkReady.
fn cri_ready(info: &str) -> bool {
    let Ok(info) = serde_json::from_str::<serde_json::Value>(info) else {
        return false;
    };
    let conditions = info["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ["RuntimeReady", "NetworkReady"].iter().all(|wanted| {
        conditions
            .iter()
            .any(|c| c["type"] == *wanted && c["status"] == true)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_is_ready_when_both_conditions_are() {
        let info = |network: bool| {
            format!(
                r#"{{"status": {{"conditions": [
                    {{"type": "RuntimeReady", "status": true}},
                    {{"type": "NetworkReady", "status": {network}, "reason": "NetworkPluginNotReady"}}
                ]}}, "config": {{"enableSelinux": false}}}}"#
            )
        };
        assert!(cri_ready(&info(true)));
        assert!(!cri_ready(&info(false)));
        assert!(!cri_ready("not json"));
    }

    #[test]
    fn the_conflist_chains_portmap_after_flatnet() {
        let conflist: serde_json::Value = serde_json::from_str(&conflist()).unwrap();
        assert_eq!(conflist["name"], NETWORK);
        assert_eq!(conflist["plugins"][0]["type"], "flatnet");
        assert_eq!(
            conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            SUBNET
        );
        assert_eq!(conflist["plugins"][1]["type"], "portmap");
        assert_eq!(conflist["plugins"][1]["capabilities"]["portMappings"], true);
    }
}

//! Calling a CNI plugin the way a runtime does: env + stdin, JSON back.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// A plugin binary with the configuration and CNI_PATH a runtime would use.
#[derive(Clone, Default)]
pub struct Plugin {
    pub binary: PathBuf,
    pub cni_path: String,
    /// The configuration for this plugin (name and cniVersion included).
    pub conf: String,
    /// The network namespace the runtime (the "node") runs in: the plugin
    /// enters it (and only it: the mount namespace stays, bpffs with it).
    /// None: the calling process's own.
    pub node: Option<PathBuf>,
    /// More environment for the plugin (`FLATNET_PIN_ROOT`).
    pub env: Vec<(String, String)>,
}

impl Plugin {
    fn command(&self, verb: &str, container_id: &str, netns: &Path) -> Command {
        let mut cmd = Command::new(&self.binary);
        if let Some(node) = &self.node {
            let node = node.clone();
            // SAFETY: the closure only opens a file and calls setns, both
            // async-signal-safe enough for a child before exec.
            unsafe {
                cmd.pre_exec(move || {
                    let file = std::fs::File::open(&node)?;
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
                });
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Starts the plugin and feeds it the configuration; `finish` collects it.
    pub fn start(&self, verb: &str, container_id: &str, netns: &Path) -> anyhow::Result<Child> {
        let mut child = self
            .command(verb, container_id, netns)
            .spawn()
            .with_context(|| format!("running {}", self.binary.display()))?;
        child
            .stdin
            .take()
            .context("plugin stdin")?
            .write_all(self.conf.as_bytes())?;
        Ok(child)
    }

    /// Waits for a started plugin; its JSON answer (Null when it printed nothing).
    pub fn finish(&self, verb: &str, child: Child) -> anyhow::Result<serde_json::Value> {
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "{} {verb} failed: {} {}",
                self.binary.display(),
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(if stdout.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&stdout)?
        })
    }

    pub fn call(
        &self,
        verb: &str,
        container_id: &str,
        netns: &Path,
    ) -> anyhow::Result<serde_json::Value> {
        let child = self.start(verb, container_id, netns)?;
        self.finish(verb, child)
    }
}

/// The configuration a runtime hands the first plugin of a conflist.
pub fn first_plugin_conf(conflist: &Path) -> anyhow::Result<(String, String)> {
    let list: serde_json::Value = serde_json::from_slice(&std::fs::read(conflist)?)?;
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    let name = list["name"]
        .as_str()
        .context("conflist has no name")?
        .to_string();
    Ok((name, plugin.to_string()))
}

/// The first address of a result, without its prefix length.
pub fn first_ip(result: &serde_json::Value) -> anyhow::Result<String> {
    let address = result["ips"][0]["address"]
        .as_str()
        .context("result has no address")?;
    Ok(address.split('/').next().unwrap_or(address).to_string())
}

/// A named network namespace; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> anyhow::Result<Self> {
        // One left by an interrupted run is replaced.
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        let out = Command::new("ip").args(["netns", "add", name]).output()?;
        if !out.status.success() {
            bail!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let ns = Netns {
            name: name.to_string(),
        };
        let _ = ns.exec(&["ip", "link", "set", "lo", "up"]).output();
        Ok(ns)
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// A command run inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(args);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

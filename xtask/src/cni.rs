//! Calling a CNI plugin the way a runtime does (env + stdin, JSON back),
//! through the harness the integration tests use.

use std::path::{Path, PathBuf};
use std::process::Child;

use anyhow::{Context, bail};
use flatnet_harness::{CniCall, CniOutput, Conflist, result_ips};

/// A plugin binary with the configuration and environment a runtime would
/// use.
#[derive(Clone)]
pub struct Plugin {
    pub binary: PathBuf,
    /// The configuration for this plugin (name and cniVersion included).
    pub conf: String,
    /// The runtime's side of every call: CNI_PATH, the interface name, the
    /// node's network namespace (`node`) and more environment (`env`).
    pub runtime: CniCall,
}

impl Plugin {
    /// `binary` with `conf`, finding its delegates in `cni_path`; the
    /// caller's environment passes on to it, as libcni's does.
    pub fn new(binary: PathBuf, cni_path: &str, conf: String) -> Self {
        Plugin {
            binary,
            conf,
            runtime: CniCall {
                ifname: "eth0".into(),
                path: cni_path.into(),
                inherit_env: true,
                ..CniCall::default()
            },
        }
    }

    fn invocation(&self, verb: &str, container_id: &str, netns: &Path) -> CniCall {
        CniCall {
            command: verb.into(),
            container_id: container_id.into(),
            netns: netns.display().to_string(),
            ..self.runtime.clone()
        }
    }

    /// Starts the plugin and feeds it the configuration; `finish` collects it.
    pub fn start(&self, verb: &str, container_id: &str, netns: &Path) -> anyhow::Result<Child> {
        self.invocation(verb, container_id, netns)
            .try_spawn(&self.binary, self.conf.as_bytes())
            .with_context(|| format!("running {}", self.binary.display()))
    }

    /// Waits for a started plugin; its JSON answer (Null when it printed nothing).
    pub fn finish(&self, verb: &str, child: Child) -> anyhow::Result<serde_json::Value> {
        let out = CniOutput::from(child.wait_with_output()?);
        if !out.success() {
            bail!(
                "{} {verb} failed: {} {}",
                self.binary.display(),
                out.stdout.trim(),
                out.stderr.trim()
            );
        }
        Ok(if out.stdout.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&out.stdout)?
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

/// The network's name and the configuration a runtime hands the first
/// plugin of a conflist.
pub fn first_plugin_conf(conflist: &Path) -> anyhow::Result<(String, String)> {
    let list = Conflist::new(serde_json::from_slice(&std::fs::read(conflist)?)?);
    let name = list.list["name"]
        .as_str()
        .context("conflist has no name")?
        .to_string();
    Ok((name, list.first_plugin_conf().to_string()))
}

/// The first address of a result, without its prefix length.
pub fn first_ip(result: &serde_json::Value) -> anyhow::Result<String> {
    result_ips(result)
        .first()
        .map(ToString::to_string)
        .context("result has no address")
}

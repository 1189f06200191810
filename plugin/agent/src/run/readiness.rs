//! Readiness: decided afresh at each pass from the node's own setup and
//! the features the agent runs, and reported to CNI STATUS (the marker),
//! the `flatnet_agent_ready` gauge and /readyz.

use std::path::Path;

use crate::config::ServicesMode;
use crate::install::{self};
use crate::metrics::{self};
use crate::node_state::remove_if_present;
use crate::policy::watch::PolicyObjects;
use flatnet_datapath::bpf::DATAPATH_ID;
use flatnet_datapath::node::markers as ready;

use super::Agent;

/// Why the `flatnet` plugin in `bin_dir` cannot serve this agent's network:
/// it is another datapath build (its `--version` says which), so its ADDs
/// are refused there; None when it is this build.
pub(super) fn plugin_build_problem(bin_dir: &Path) -> Option<String> {
    let plugin = bin_dir.join("flatnet");
    let said = std::process::Command::new(&plugin)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned());
    let build = said.as_deref().and_then(|text| {
        text.split_whitespace()
            .skip_while(|w| *w != "datapath")
            .nth(1)
    });
    match build {
        Some(build) if build == DATAPATH_ID => None,
        Some(build) => Some(format!(
            "the flatnet plugin in {} is datapath build {build}, this agent's is {DATAPATH_ID}: its ADDs are refused on this network until the agent's binaries are installed",
            bin_dir.display()
        )),
        None => Some(format!(
            "{} does not say its datapath build (missing, or older than this agent): ADDs may be refused",
            plugin.display()
        )),
    }
}

impl Agent {
    /// Makes the ready marker, `flatnet_agent_ready` and /readyz say
    /// `ready`. The marker goes first when leaving readiness (STATUS is
    /// what stops new pods) and comes first when entering it.
    /// Readiness from the node's setup and the features the agent was
    /// started with: NetworkPolicy or eBPF Services whose watches have not
    /// listed every kind are down (never silently open: new pods start
    /// isolated meanwhile), and the node is not ready, saying why.
    pub(super) fn refresh_ready(&mut self) {
        let problem = self.objects.as_ref().and_then(PolicyObjects::problem);
        // Policy the maps cannot hold (held closed meanwhile) is down too.
        let written = self.policy.as_ref().and_then(|e| e.sync.problem());
        let mut down = Vec::new();
        for (enabled, feature, what) in [
            (self.args.network_policy, "network_policy", "NetworkPolicy"),
            (
                self.args.services == ServicesMode::Ebpf,
                "services_ebpf",
                "Services in eBPF",
            ),
        ] {
            if !enabled || self.objects.is_none() {
                continue;
            }
            let problem = match (&problem, &written) {
                (Some(problem), _) => Some(problem.clone()),
                (None, Some(written)) if feature == "network_policy" => Some(written.clone()),
                _ => None,
            };
            self.metrics
                .feature_ready
                .get_or_create(&metrics::FeatureLabel {
                    feature: feature.into(),
                })
                .set(i64::from(problem.is_none()));
            if let Some(problem) = &problem {
                down.push(format!("{what} is not enforced on this node: {problem}"));
            }
        }
        down.extend(self.plugin_problem.clone());
        let mut reasons = down.clone();
        if !self.setup_ok {
            reasons.insert(
                0,
                "the node's setup is not complete (see the agent's log)".into(),
            );
        }
        if let Ok(mut not_ready) = self.metrics.not_ready.lock() {
            *not_ready = reasons;
        }
        self.report_ready(self.setup_ok, &down);
    }

    /// The ready marker and gauge: ready when `setup_ok` and nothing is
    /// `down`; with features down the marker stays, naming them, so CNI
    /// STATUS says which and why.
    pub(super) fn report_ready(&mut self, setup_ok: bool, down: &[String]) {
        let marker = ready::ready_marker(&self.args.network);
        let ready = setup_ok && down.is_empty();
        if setup_ok {
            if self.ready == ready && marker.exists() && ready {
                return;
            }
            let mut content = serde_json::json!({
                "node": self.node_name,
                "pid": std::process::id(),
                "datapathId": DATAPATH_ID,
            });
            if !down.is_empty() {
                content["down"] = serde_json::json!(down);
            }
            if let Err(e) =
                install::write_atomically(&marker, format!("{content}\n").as_bytes(), 0o644)
            {
                tracing::error!(error = %e, "cannot write the ready marker; not ready");
                self.metrics.ready.set(0);
                self.ready = false;
                return;
            }
            self.metrics.ready.set(i64::from(ready));
            if ready && !self.ready {
                tracing::info!("node ready: CNI STATUS now answers ready");
            }
            if !ready && self.ready {
                tracing::warn!(down = ?down, "node no longer ready: a feature is down");
            }
            self.ready = ready;
        } else {
            if let Err(e) = remove_if_present(&marker) {
                tracing::error!(error = %e, "cannot remove the ready marker");
            }
            self.metrics.ready.set(0);
            if self.ready {
                tracing::warn!(
                    "node no longer ready: CNI STATUS answers 50 until it is set up again"
                );
            }
            self.ready = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A `flatnet` in a folder of its own that prints `version`.
    pub(super) fn plugin_saying(version: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flatnet");
        std::fs::write(&path, format!("#!/bin/sh\necho '{version}'\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    pub(super) fn an_installed_plugin_of_another_build_is_named() {
        let same = plugin_saying(&format!("flatnet 0.1.0 datapath {DATAPATH_ID}"));
        assert_eq!(plugin_build_problem(same.path()), None);
        let other = plugin_saying("flatnet 0.1.0 datapath 0123456789ab");
        let problem = plugin_build_problem(other.path()).expect("another build");
        assert!(
            problem.contains("0123456789ab") && problem.contains(DATAPATH_ID),
            "{problem}"
        );
        let old = plugin_saying("flatnet 0.1.0");
        assert!(plugin_build_problem(old.path()).is_some());
    }
}

//! Markers the agent leaves under /run/flatnet for the plugin, per network:
//!
//! - `agent-<network>.ready` while the agent has the node set up (datapath
//!   pinned, uplink program attached, routes and conflist written). STATUS
//!   of a configuration marked `"agentManaged": true` answers 50 without it.
//! - `agent-<network>.managed` from the agent's first start on: the network's
//!   datapath belongs to the agent, so the last pod's DEL leaves it pinned.
//! - `policy-<network>.json`: the NetworkPolicies selecting each local pod.
//!
//! Plain files: the plugin reads them, the agent (its own crate) writes
//! them; neither needs the other's code.

use std::path::{Path, PathBuf};

use crate::bpf::pin_name;
use crate::lock::LOCK_DIR;

/// The configuration key (in the flatnet plugin's entry) that makes STATUS
/// wait for the agent.
pub const AGENT_MANAGED_KEY: &str = "agentManaged";

fn marker(network: &str, kind: &str) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("agent-{}.{kind}", pin_name(network)))
}

pub fn ready_marker(network: &str) -> PathBuf {
    marker(network, "ready")
}

pub fn managed_marker(network: &str) -> PathBuf {
    marker(network, "managed")
}

/// `policy-<network>.json`: which NetworkPolicies select each local pod, by
/// pod address (`{"10.42.0.4": ["default/deny-all"]}`), written by the
/// agent whenever it applies policy and shown by `flatnet inspect`.
pub fn policy_names_file(network: &str) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("policy-{}.json", pin_name(network)))
}

/// True once an agent has taken `network` over on this node.
pub fn is_agent_managed(network: &str) -> bool {
    managed_marker(network).exists()
}

/// STATUS's view: a problem to report when the configuration says an
/// agent manages the network and the agent has not said it is ready.
pub fn agent_problem(network: &str, stdin: &[u8]) -> Option<String> {
    let conf: serde_json::Value = serde_json::from_slice(stdin).ok()?;
    if conf.get(AGENT_MANAGED_KEY) != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    let marker = ready_marker(network);
    let Ok(content) = std::fs::read(&marker) else {
        return Some(format!(
            "the flatnet agent has not finished setting up this node yet ({} is missing): check the flatnet-agent logs",
            marker.display()
        ));
    };
    // A feature the agent runs that is down (its watches cannot list).
    let said: serde_json::Value = serde_json::from_slice(&content).unwrap_or_default();
    let down: Vec<&str> = said["down"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|line| line.as_str())
        .collect();
    (!down.is_empty()).then(|| down.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_live_in_the_run_dir_under_the_pin_name() {
        assert_eq!(
            ready_marker("a.b"),
            Path::new("/run/flatnet/agent-a~b.ready")
        );
        assert_eq!(
            managed_marker("pods"),
            Path::new("/run/flatnet/agent-pods.managed")
        );
    }

    #[test]
    fn only_agent_managed_configurations_wait_for_the_agent() {
        let network = "flatnet-ready-test-never-marked";
        assert!(agent_problem(network, br#"{"name": "x"}"#).is_none());
        assert!(agent_problem(network, br#"{"agentManaged": false}"#).is_none());
        assert!(agent_problem(network, b"not json").is_none());
        let problem = agent_problem(network, br#"{"agentManaged": true}"#).unwrap();
        assert!(problem.contains("agent"), "{problem}");
    }
}

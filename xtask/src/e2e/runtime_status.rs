//! The runtime's side of CNI 1.1 on a real node: containerd 2 answers
//! kubelet's CRI Status by calling flatnet's STATUS, and kubelet turns a
//! failed STATUS into `NetworkReady=false` and the node's Ready condition.
//! The check takes the agent off the last node (the DaemonSet's pod leaves
//! it, and a stopping agent withdraws its ready marker), waits for that
//! node to go NotReady with flatnet's own message, puts the agent back and
//! waits for Ready again. Nothing else tells a scheduler that a node's
//! network cannot take new pods.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::cluster::Cluster;

/// What the check saw.
pub struct RuntimeStatus {
    pub node: String,
    /// The Ready condition's message while the agent was away.
    pub message: String,
    /// Seconds from the agent's removal to NotReady, and from its return
    /// to Ready.
    pub not_ready_after: f64,
    pub ready_again_after: f64,
}

/// What flatnet's STATUS says when its agent is not running
/// (plugin/flatnet/src/verbs/status.rs).
const FLATNET_SAYS: &str = "cannot serve ADD";

const TIMEOUT: Duration = Duration::from_secs(180);

pub fn check(cluster: &Cluster) -> anyhow::Result<RuntimeStatus> {
    let node = cluster
        .nodes
        .last()
        .context("the cluster has no node")?
        .name
        .clone();
    let outcome = run(cluster, &node);
    // Whatever happened, the agent goes back everywhere.
    let restored = restore(cluster);
    let status = outcome.context("the runtime status check (STATUS through containerd)")?;
    restored?;
    Ok(status)
}

fn run(cluster: &Cluster, node: &str) -> anyhow::Result<RuntimeStatus> {
    let cp = &cluster.control_plane;
    let (ready, message) = ready_condition(cluster, node)?;
    if ready != "True" {
        bail!("{node} is not Ready before the check: {message}");
    }
    let away = format!(
        r#"{{"spec":{{"template":{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"kubernetes.io/hostname","operator":"NotIn","values":["{node}"]}}]}}]}}}}}}}}}}}}}}"#
    );
    cp.kubectl(&[
        "-n",
        "kube-system",
        "patch",
        "daemonset",
        "flatnet-agent",
        "--type=merge",
        "-p",
        &away,
    ])?;
    let started = Instant::now();
    let message = wait_for(cluster, node, "False")?;
    let not_ready_after = started.elapsed().as_secs_f64();
    if !message.contains(FLATNET_SAYS) {
        bail!("{node} went NotReady, but not with flatnet's STATUS message: {message}");
    }
    let started = Instant::now();
    restore(cluster)?;
    wait_for(cluster, node, "True")?;
    Ok(RuntimeStatus {
        node: node.to_string(),
        message,
        not_ready_after,
        ready_again_after: started.elapsed().as_secs_f64(),
    })
}

/// The DaemonSet without the affinity, rolled out on every node.
fn restore(cluster: &Cluster) -> anyhow::Result<()> {
    let cp = &cluster.control_plane;
    let affinity = cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "daemonset",
        "flatnet-agent",
        "-o",
        "jsonpath={.spec.template.spec.affinity}",
    ])?;
    if !affinity.trim().is_empty() {
        cp.kubectl(&[
            "-n",
            "kube-system",
            "patch",
            "daemonset",
            "flatnet-agent",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/template/spec/affinity"}]"#,
        ])?;
    }
    cluster.rollout("daemonset/flatnet-agent", TIMEOUT)
}

/// Polls the node's Ready condition until its status is `want`; its
/// message then.
fn wait_for(cluster: &Cluster, node: &str, want: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, message) = ready_condition(cluster, node)?;
        if status == want {
            return Ok(message);
        }
        if Instant::now() > deadline {
            bail!("{node}'s Ready condition is not {want} after {TIMEOUT:?}: {status}: {message}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The node's Ready condition: status and message.
fn ready_condition(cluster: &Cluster, node: &str) -> anyhow::Result<(String, String)> {
    let said = cluster.control_plane.kubectl(&[
        "get",
        "node",
        node,
        "-o",
        r#"jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{.message}{end}"#,
    ])?;
    let (status, message) = said.split_once('\n').unwrap_or((said.as_str(), ""));
    Ok((status.trim().to_string(), message.trim().to_string()))
}

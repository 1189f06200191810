//! flatnet's own check on the real cluster: NetworkPolicy holds from a
//! pod's first packet. A client pod is created in a namespace whose policy
//! denies all egress, and from the first instant of its container it tries
//! a server pod in another namespace every 100 ms. Not one try may get
//! through. Then the policy is deleted and the same client must get
//! through (so the probe is proven able to succeed). This is what the
//! upstream NetworkPolicy tests found broken on Kubernetes 1.20 when the
//! agent learned a pod's address from `status.podIP` (1-8 s open).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::cluster::Cluster;
use super::images::AGNHOST;

const SERVER_NS: &str = "flatnet-first-packet-server";
const CLIENT_NS: &str = "flatnet-first-packet-client";
/// Tries the probe must make under the policy, and the time it gets.
const TRIES: usize = 20;
const TRIES_WITHIN: Duration = Duration::from_secs(60);

/// What the probe saw.
pub struct FirstPacket {
    /// Tries made while the policy was in force, and how many got through.
    pub tries: usize,
    pub through: usize,
    /// Seconds from deleting the policy to the first try through.
    pub opened_after: f64,
}

pub fn check(cluster: &Cluster) -> anyhow::Result<FirstPacket> {
    let cp = &cluster.control_plane;
    let result = run(cluster).context("flatnet's first-packet check");
    for ns in [CLIENT_NS, SERVER_NS] {
        let _ = cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
    result
}

fn run(cluster: &Cluster) -> anyhow::Result<FirstPacket> {
    let cp = &cluster.control_plane;
    // The server on the second node, the client on the first: the
    // probe crosses nodes.
    let server_node = &cluster.nodes[cluster.nodes.len() - 1].name;
    let client_node = &cluster.nodes[0].name;
    let agnhost = AGNHOST[0];
    cp.apply(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {SERVER_NS}
---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: {SERVER_NS}
spec:
  nodeName: {server_node}
  containers:
  - name: server
    image: {agnhost}
    args: ["netexec", "--http-port=8080"]
"#
    ))?;
    cp.kubectl(&[
        "-n",
        SERVER_NS,
        "wait",
        "--for=condition=Ready",
        "pod/server",
        "--timeout=120s",
    ])?;
    let server_ip = cp
        .kubectl(&[
            "-n",
            SERVER_NS,
            "get",
            "pod",
            "server",
            "-o",
            "jsonpath={.status.podIP}",
        ])?
        .trim()
        .to_string();
    // The namespace and its policy first, then the client.
    cp.apply(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {CLIENT_NS}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: deny-egress
  namespace: {CLIENT_NS}
spec:
  podSelector: {{}}
  policyTypes: ["Egress"]
"#
    ))?;
    cp.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: {CLIENT_NS}
spec:
  nodeName: {client_node}
  containers:
  - name: client
    image: {agnhost}
    command: ["/bin/sh", "-c"]
    args:
    - |
      while :; do
        if /agnhost connect {server_ip}:8080 --timeout=200ms 2>/dev/null; then echo THROUGH; else echo BLOCKED; fi
        sleep 0.1
      done
"#
    ))?;
    cp.kubectl(&[
        "-n",
        CLIENT_NS,
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=120s",
    ])?;
    // At least ten seconds and TRIES tries under the policy. A try takes
    // 0.3 s on an idle node and more on a loaded one (a process started,
    // a 200 ms timeout): the count, not the time, is what must be reached.
    let probing = Instant::now();
    let logs = loop {
        std::thread::sleep(Duration::from_secs(1));
        let logs = cp.kubectl(&["-n", CLIENT_NS, "logs", "client"])?;
        let tries = logs.lines().count();
        if tries >= TRIES && probing.elapsed() >= Duration::from_secs(10) {
            break logs;
        }
        if probing.elapsed() > TRIES_WITHIN {
            bail!("the first-packet probe made only {tries} tries in {TRIES_WITHIN:?}:\n{logs}");
        }
    };
    let tries = logs.lines().count();
    let through = logs.lines().filter(|l| *l == "THROUGH").count();
    // Without the policy the same probe must get through.
    cp.kubectl(&["-n", CLIENT_NS, "delete", "networkpolicy", "deny-egress"])?;
    let deleted = Instant::now();
    let opened_after = loop {
        let logs = cp.kubectl(&["-n", CLIENT_NS, "logs", "client", "--tail=5"])?;
        if logs.lines().any(|l| l == "THROUGH") {
            break deleted.elapsed().as_secs_f64();
        }
        if deleted.elapsed() > Duration::from_secs(60) {
            bail!(
                "the first-packet probe did not get through within 60 s of deleting the policy (the probe itself is broken?)"
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    Ok(FirstPacket {
        tries,
        through,
        opened_after,
    })
}

//! RunPodSandbox latency, flatnet against the bridge plugin (the benchmark's
//! CRI rows run this test).

use std::time::{Duration, Instant};

use flatnet_tests::cri::{CriClient, PodSpec};
use flatnet_tests::*;
use serde_json::json;

use super::node::{Node, cri_tools};
use super::sandbox::stop_and_remove;

/// Median RunPodSandbox latency over `runs` sequential sandboxes (each
/// stopped and removed before the next, outside the timing), in ms.
fn median_run_latency(node: &Node, client: &CriClient, runs: usize, label: &str) -> f64 {
    let mut millis = Vec::with_capacity(runs);
    for i in 0..runs {
        let pod = PodSpec::new(&format!("{label}{i}"));
        let started = Instant::now();
        let id = client
            .run_pod_sandbox(&pod)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", node.containerd().log_tail()));
        millis.push(started.elapsed().as_secs_f64() * 1000.0);
        client.stop_pod_sandbox(&id).expect("stop");
        client.remove_pod_sandbox(&id).expect("remove");
    }
    millis.sort_by(f64::total_cmp);
    millis[runs / 2]
}

/// RunPodSandbox latency, flatnet against the reference bridge with
/// host-local, under one containerd: one JSON line on stdout. Not part of
/// the normal run (`cargo test -p flatnet-tests --test cri -- --ignored
/// run_pod_sandbox_latency --nocapture`).
#[flatnet_test(root, tools = cri_tools())]
#[ignore = "a benchmark: run it with --ignored"]
fn run_pod_sandbox_latency_flatnet_vs_bridge() {
    const RUNS: usize = 20;
    let mut node = Node::new(false);
    let client = node.client();
    // A first sandbox loads the datapath, and stays: a node has pods, and
    // the last pod's DEL unloads the network. Not what is measured.
    let warm = node.run_sandbox(&client, "warm");
    let flatnet = median_run_latency(&node, &client, RUNS, "flat");
    stop_and_remove(&client, &warm);

    // The baseline: the same containerd, its conf dir switched to bridge.
    let bridge = unique("flcb");
    let host_local_dir = node.dir.join("host-local");
    node.baseline = Some((bridge.clone(), host_local_dir.clone()));
    let octets: Vec<&str> = node.prefix.split('.').collect();
    let baseline_prefix = format!("10.{}.{}", 250, octets[2]);
    node.write_conf(
        "00-bridge.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": format!("{}-bridge", node.network),
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipam": {
                    "type": "host-local",
                    "subnet": format!("{baseline_prefix}.0/24"),
                    "dataDir": host_local_dir.display().to_string(),
                },
            }],
        }),
    );
    std::fs::remove_file(node.conf_dir().join("10-flatnet.conflist")).expect("switch the conf");
    // containerd reloads its conf dir on change: until then, sandboxes
    // still land on flatnet. The first on the bridge stays, as above.
    let mut warm_bridge = None;
    wait_until(
        "containerd to load the bridge conflist",
        Duration::from_secs(20),
        || {
            let warm = node.run_sandbox_raw(&client, "warmbridge");
            let ip = client.pod_sandbox_status(&warm).expect("status").ip;
            if ip.starts_with(&format!("{baseline_prefix}.")) {
                warm_bridge = Some(warm);
                return true;
            }
            client.stop_pod_sandbox(&warm).expect("stop");
            client.remove_pod_sandbox(&warm).expect("remove");
            false
        },
    );
    let bridge_median = median_run_latency(&node, &client, RUNS, "br");
    if let Some(id) = warm_bridge {
        client.stop_pod_sandbox(&id).expect("stop");
        client.remove_pod_sandbox(&id).expect("remove");
    }
    println!(
        "{}",
        json!({
            "bench": "cri_run_pod_sandbox",
            "runtime": client.version().unwrap_or_default(),
            "runs": RUNS,
            "flatnet_median_ms": (flatnet * 100.0).round() / 100.0,
            "bridge_median_ms": (bridge_median * 100.0).round() / 100.0,
        })
    );
}

impl Node {
    /// RunPodSandbox without the flatnet checks (the baseline network).
    fn run_sandbox_raw(&self, client: &CriClient, name: &str) -> String {
        client
            .run_pod_sandbox(&PodSpec::new(name))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()))
    }
}

//! RunPodSandbox under a real containerd (CRI), flatnet against the
//! reference bridge + host-local: the benchmark lives in the CRI test suite
//! (tests/tests/integration/cri.rs, `--ignored`), which has the containerd harness and
//! the CRI client; xtask runs it on the release plugins just built and keeps
//! its one JSON line. Not in `--smoke`: 40 sandboxes take about 8 s.

use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::util;

const TEST: &str = "run_pod_sandbox_latency_flatnet_vs_bridge";

/// {"flatnet_median_ms", "bridge_median_ms", "runs", "runtime", ...}.
pub fn run_pod_sandbox(plugin_dir: &Path) -> anyhow::Result<Value> {
    let output = util::integration_test()
        .arg("--")
        .args([
            "--ignored",
            "--exact",
            &format!("cri::bench::{TEST}"),
            "--nocapture",
        ])
        .env("FLATNET_BIN_DIR", plugin_dir)
        .env("FLATNET_REQUIRE_ROOT", "1")
        .output()
        .context("running the CRI benchmark")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|line| line.contains("\"cri_run_pod_sandbox\""));
    match (output.status.success(), line) {
        (true, Some(line)) => serde_json::from_str(line).context("the CRI benchmark's JSON line"),
        _ => bail!(
            "the CRI benchmark failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

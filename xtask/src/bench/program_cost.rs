//! Where a packet's nanoseconds go: `from_pod` (and `to_pod`, the floor)
//! timed by the kernel on one kind of frame at a time (`BPF_PROG_TEST_RUN`
//! with a repeat count), from the frame that stops after the sender's own
//! lookups to the ones that ask the kernel's conntrack. The cases live in the integration suite
//! (`programs::cost`, `--ignored`), which has the scratch datapath and the
//! frame builder; xtask runs it a few times and keeps the median per case.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::util;

const TEST: &str = "programs::cost::program_cost_per_frame";

/// One run of the measuring test: (case, ns per run) in its order.
fn measure_once(plugin_dir: &Path) -> anyhow::Result<Vec<(String, f64)>> {
    let out = std::env::temp_dir().join(format!("flatnet-program-cost-{}", std::process::id()));
    let output = util::integration_test()
        .arg("--")
        .args(["--ignored", "--exact", TEST])
        .env("FLATNET_BIN_DIR", plugin_dir)
        .env("FLATNET_REQUIRE_ROOT", "1")
        .env("FLATNET_PROGRAM_COST", &out)
        .output()
        .context("running the program cost measurement")?;
    let written = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    let (true, Ok(written)) = (output.status.success(), written) else {
        bail!(
            "the program cost measurement failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    written
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).context("a program cost line")?;
            let case = value["case"].as_str().context("a case name")?.to_string();
            let ns = value["ns"].as_f64().context("a time")?;
            Ok((case, ns))
        })
        .collect()
}

/// `runs` measurements; per case its times and their median.
pub fn run(plugin_dir: &Path, runs: usize) -> anyhow::Result<Value> {
    let mut cases: Vec<(String, Vec<f64>)> = Vec::new();
    for _ in 0..runs {
        for (i, (case, ns)) in measure_once(plugin_dir)?.into_iter().enumerate() {
            match cases.get_mut(i) {
                Some((name, times)) if *name == case => times.push(ns),
                _ => cases.insert(i, (case, vec![ns])),
            }
        }
    }
    let rows: Vec<Value> = cases
        .into_iter()
        .map(|(case, mut times)| {
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            json!({"case": case, "ns": times, "median_ns": median})
        })
        .collect();
    Ok(json!({"mode": "tc", "runs": runs, "cases": rows}))
}

/// The cases as a markdown table.
pub fn table(cost: &Value) -> String {
    let mut out = String::from("| frame | ns per run (median) | runs |\n|---|---|---|\n");
    for case in cost["cases"].as_array().cloned().unwrap_or_default() {
        let times: Vec<String> = case["ns"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| format!("{:.0}", t.as_f64().unwrap_or(f64::NAN)))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} |",
            case["case"].as_str().unwrap_or("?"),
            case["median_ns"].as_f64().unwrap_or(f64::NAN),
            times.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_case_with_its_median() {
        let cost = json!({"cases": [
            {"case": "udp 64 B to a local pod", "ns": [210.0, 220.0, 300.0], "median_ns": 220.0}
        ]});
        let table = table(&cost);
        assert!(
            table.contains("| udp 64 B to a local pod | 220 | 210, 220, 300 |"),
            "{table}"
        );
    }
}

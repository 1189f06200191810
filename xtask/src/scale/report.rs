//! The scale run as docs/benchmarks.md shows it: the table, the chart
//! and each of the targets, met or not, from results/scale.json.

use serde_json::Value;

use super::table;

/// `field` of `row`, by path.
fn at(row: &Value, path: &[&str]) -> Option<f64> {
    path.iter()
        .try_fold(row, |v, key| v.get(*key))
        .and_then(Value::as_f64)
}

/// Memory each pod of the cluster adds to the agent: the slope of churn
/// RSS between the smallest and the largest size run, in KiB.
fn kib_per_pod(rows: &[Value]) -> Option<f64> {
    let (first, last) = (rows.first()?, rows.last()?);
    let pods = at(last, &["pods"])? - at(first, &["pods"])?;
    let bytes = at(last, &["churn", "rss_bytes"])? - at(first, &["churn", "rss_bytes"])?;
    (pods > 0.0).then(|| bytes / pods / 1024.0)
}

/// One line per target: what it asks, what was measured at the largest
/// size, and whether that meets it.
fn targets(rows: &[Value]) -> String {
    let Some(largest) = rows.last() else {
        return String::new();
    };
    let size = format!(
        "at {} pods and {} policies",
        largest["pods"], largest["policies"]
    );
    let max_of = |path: &[&str]| {
        rows.iter()
            .filter_map(|row| at(row, path))
            .fold(f64::NAN, f64::max)
    };
    let wrong: f64 = rows
        .iter()
        .filter_map(|r| at(r, &["probes", "wrong"]))
        .sum();
    let probes: f64 = rows
        .iter()
        .filter_map(|r| at(r, &["probes", "count"]))
        .sum();
    let lines: Vec<(String, Option<f64>, f64, bool)> = vec![
        (
            "agent RSS per pod in the cluster, KiB (under 1)".into(),
            kib_per_pod(rows),
            1.0,
            true,
        ),
        (
            format!("agent RSS {size}, MiB (under 200)"),
            at(largest, &["churn", "rss_bytes"]).map(|b| b / 1048576.0),
            200.0,
            true,
        ),
        (
            "network programming p99, any size, ms (under 1,000)".into(),
            Some(max_of(&["latency", "network_programming", "p99_ms"])),
            1000.0,
            true,
        ),
        (
            "the agent's part of it (EndpointSlice to maps) p99, any size, ms (under 50)".into(),
            Some(max_of(&["latency", "endpoint_slice_to_maps", "p99_ms"])),
            50.0,
            true,
        ),
        (
            format!("policy implementation p50 {size}, ms (under 5)"),
            at(largest, &["latency", "policy_implementation", "p50_ms"]),
            5.0,
            true,
        ),
        (
            format!("policy implementation p99 {size}, ms (under 100)"),
            at(largest, &["latency", "policy_implementation", "p99_ms"]),
            100.0,
            true,
        ),
        (
            "idle CPU, any size, % of a core (under 0.2)".into(),
            Some(max_of(&["idle", "cpu_share"]) * 100.0),
            0.2,
            true,
        ),
        (
            format!("wrong probe verdicts of {probes:.0} (0)"),
            Some(wrong),
            0.0,
            false,
        ),
    ];
    lines
        .into_iter()
        .map(|(what, measured, bound, strictly_under)| {
            let verdict = match measured {
                Some(m) if m.is_finite() && (m < bound || (!strictly_under && m <= bound)) => "met",
                Some(m) if m.is_finite() => "**missed**",
                _ => "not measured",
            };
            let shown = measured
                .filter(|m| m.is_finite())
                .map_or("-".into(), |m| format!("{m:.2}"));
            format!("- {what}: {shown}, {verdict}\n")
        })
        .collect()
}

/// Where the largest size's memory and idle CPU go: what the watch stores
/// hold per kind, and what one periodic re-check takes.
fn where_it_goes(rows: &[Value]) -> String {
    let Some(largest) = rows.last() else {
        return String::new();
    };
    let mut text = String::new();
    if let Some(kinds) = largest["stores"].as_object() {
        let held: Vec<String> = kinds
            .iter()
            .filter_map(|(kind, held)| {
                let (bytes, objects) = (held["bytes"].as_f64()?, held["objects"].as_f64()?);
                let each = if objects > 0.0 { bytes / objects } else { 0.0 };
                Some(format!(
                    "{kind} {:.0} MiB ({each:.0} B each)",
                    bytes / 1048576.0
                ))
            })
            .collect();
        text.push_str(&format!(
            "- The watch stores' share of the RSS at {} pods: {}.\n",
            largest["pods"],
            held.join(", ")
        ));
    }
    if let Some(p50) = at(largest, &["resync", "p50_ms"]) {
        text.push_str(&format!(
            "- One periodic re-check of the node at {} nodes (every 30 s by default; what an idle agent spends its CPU on): p50 {p50:.1} ms, {:.0} runs.\n",
            largest["nodes"],
            at(largest, &["resync", "count"]).unwrap_or(0.0)
        ));
    }
    text
}

/// The page's section; a note when no run is in results/.
pub fn section(report: Option<&Value>) -> String {
    let Some(report) = report else {
        return "No scale run in `results/` (run `cargo xtask scale`).\n".into();
    };
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    format!(
        "Run at commit {} on {}, {} changes a second.\n\n{}\n![The agent against the cluster's size](../results/scale.png)\n\nThe issue's targets:\n\n{}\n{}",
        report["commit"].as_str().unwrap_or("?"),
        report["date"].as_str().unwrap_or("?"),
        report["rate"],
        table(&rows),
        targets(&rows),
        where_it_goes(&rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(pods: u64, rss_mib: f64, p50: f64, wrong: u64) -> Value {
        json!({"size": "x", "pods": pods, "policies": pods / 5,
               "idle": {"cpu_share": 0.001, "rss_bytes": rss_mib * 1048576.0},
               "churn": {"rss_bytes": rss_mib * 1048576.0, "cpu_share": 0.5},
               "latency": {"network_programming": {"p50_ms": 3.0, "p99_ms": 20.0},
                           "endpoint_slice_to_maps": {"p50_ms": 2.0, "p99_ms": 9.0},
                           "policy_implementation": {"p50_ms": p50, "p99_ms": 40.0}},
               "probes": {"count": 100, "wrong": wrong}})
    }

    #[test]
    fn each_target_is_judged_on_the_runs_rows() {
        // 1,500 -> 150,000 pods for 50 MiB more: 0.34 KiB a pod.
        let rows = [row(1_500, 30.0, 2.0, 0), row(150_000, 80.0, 7.5, 0)];
        let text = targets(&rows);
        assert!(
            text.contains("per pod in the cluster, KiB (under 1): 0.34, met"),
            "{text}"
        );
        assert!(text.contains("MiB (under 200): 80.00, met"), "{text}");
        assert!(
            text.contains("p50 at 150000 pods and 30000 policies, ms (under 5): 7.50, **missed**"),
            "{text}"
        );
        assert!(
            text.contains("wrong probe verdicts of 200 (0): 0.00, met"),
            "{text}"
        );
        let mut largest = row(150_000, 80.0, 7.5, 0);
        largest["stores"] = json!({"Pod": {"objects": 100, "bytes": 2097152}});
        largest["resync"] = json!({"count": 3.0, "p50_ms": 41.25});
        let said = where_it_goes(&[largest]);
        assert!(said.contains("Pod 2 MiB (20972 B each)"), "{said}");
        assert!(said.contains("p50 41.2 ms, 3 runs"), "{said}");
        let wrong = targets(&[row(1_500, 30.0, 2.0, 1)]);
        assert!(wrong.contains("(0): 1.00, **missed**"), "{wrong}");
        assert!(section(None).contains("cargo xtask scale"));
    }
}

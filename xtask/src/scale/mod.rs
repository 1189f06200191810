//! `cargo xtask scale`: the agent against synthetic clusters of growing
//! size (the tests crate's `flatnet-scale`, one run per size), idle and
//! churned, its pods probing all the while; results/scale.json and
//! results/scale.md.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use crate::util;

pub mod chart;
pub mod report;

const BIN: &str = "flatnet-scale";
/// What the watch stores hold per kind (`flatnet-scale-memory`).
const MEMORY_BIN: &str = "flatnet-scale-memory";

#[derive(clap::Args)]
pub struct ScaleArgs {
    /// The sizes to run, smallest first (xs, s, m, l, xl: up to 5,000
    /// nodes, 150,000 pods, 10,000 Services, 30,000 NetworkPolicies).
    #[arg(long, value_delimiter = ',', default_value = "xs,s,m,l,xl")]
    pub sizes: Vec<String>,
    /// Seconds the agent is watched idle.
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u64,
    /// Seconds of churn.
    #[arg(long, default_value_t = 60)]
    pub churn_secs: u64,
    /// Pod and NetworkPolicy changes a second, in turn (Cilium's CI
    /// churns at 64).
    #[arg(long, default_value_t = 64.0)]
    pub rate: f64,
    /// The sizes to run against a real kube-apiserver and etcd (of the
    /// release `cargo xtask e2e-build` builds) instead of the API stub.
    #[arg(long, value_delimiter = ',')]
    pub real_api: Vec<String>,
    /// The debug build and the smallest size: proves the harness (its
    /// numbers mean nothing), as the suite runs it with a few seconds.
    #[arg(long)]
    pub smoke: bool,
    /// Where to write scale.json and scale.md (default: results/, or a
    /// scratch folder for a smoke).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: &ScaleArgs) -> anyhow::Result<()> {
    // When the run began, and the code it ran.
    let started = (
        crate::bench::report::now_utc(),
        crate::bench::report::commit(),
    );
    let release = !args.smoke;
    util::build(release, &crate::bench::BENCH_BINARIES)?;
    util::build_debug()?;
    let plugin_dir = util::binary(release, "flatnet")?
        .parent()
        .map(PathBuf::from)
        .context("the built plugin has no parent directory")?;
    let bin_dir = util::plugins_with_agent(&plugin_dir)?;
    let sizes = if args.smoke {
        vec!["xs".to_string()]
    } else {
        args.sizes.clone()
    };
    let (idle, churn) = (args.idle_secs, args.churn_secs);
    let kubernetes = if args.real_api.is_empty() {
        None
    } else {
        let release = crate::e2e::build::DEFAULT_RELEASE.parse()?;
        Some(crate::e2e::build::prepare(&release)?.bin_dir)
    };
    let mut rows = Vec::new();
    for size in &sizes {
        util::heading(&format!(
            "scale: size {size}, {idle} s idle, {churn} s of churn at {}/s",
            args.rate
        ));
        let api = kubernetes
            .as_deref()
            .filter(|_| args.real_api.contains(size));
        let row = run_size(&bin_dir, size, idle, churn, args.rate, api);
        match row {
            Ok(row) => {
                println!("{}", table(std::slice::from_ref(&row)));
                rows.push(row);
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&bin_dir);
                return Err(e.context(format!("size {size}")));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&bin_dir);
    // A smoke's numbers mean nothing: never over the committed results.
    let out = args.out.clone().unwrap_or_else(|| {
        if args.smoke {
            std::env::temp_dir().join("flatnet-scale-smoke")
        } else {
            util::root().join("results")
        }
    });
    std::fs::create_dir_all(&out)?;
    let report = serde_json::json!({
        "smoke": args.smoke, "rate": args.rate, "rows": rows,
        "commit": started.1, "date": started.0,
    });
    std::fs::write(
        out.join("scale.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(out.join("scale.md"), table(&rows))?;
    let wrong: u64 = rows
        .iter()
        .map(|r| r["probes"]["wrong"].as_u64().unwrap_or(1))
        .sum();
    anyhow::ensure!(
        wrong == 0,
        "{wrong} probe verdict(s) wrong: see {}",
        out.join("scale.json").display()
    );
    Ok(())
}

/// results/scale.png drawn again from results/scale.json, if there is one
/// (`cargo xtask docs`: the chart follows the committed numbers).
pub fn redraw(results: &Path) -> anyhow::Result<()> {
    let Ok(text) = std::fs::read_to_string(results.join("scale.json")) else {
        return Ok(());
    };
    let report: Value = serde_json::from_str(&text).context("scale.json is not JSON")?;
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    std::fs::write(results.join("scale.md"), table(&rows))?;
    chart::chart(&rows, &results.join("scale.png"))
}

/// One size's row; against a real API server when `kubernetes` (its
/// binaries' folder) is given.
fn run_size(
    bin_dir: &Path,
    size: &str,
    idle: u64,
    churn: u64,
    rate: f64,
    kubernetes: Option<&Path>,
) -> anyhow::Result<Value> {
    let mut command = Command::new(util::target_dir(false).join(BIN));
    command
        .args([
            size,
            &idle.to_string(),
            &churn.to_string(),
            &rate.to_string(),
        ])
        .args(kubernetes)
        .env("FLATNET_BIN_DIR", bin_dir);
    let mut row = last_json_line(command, BIN, size)?;
    // The bytes the agent's watch stores hold at this size, per kind.
    let mut memory = Command::new(util::target_dir(false).join(MEMORY_BIN));
    memory.arg(size);
    row["stores"] = last_json_line(memory, MEMORY_BIN, size)?;
    Ok(row)
}

/// Runs one of the harness's binaries (`name`) for `size` and reads the
/// JSON it prints last.
fn last_json_line(mut command: Command, name: &str, size: &str) -> anyhow::Result<Value> {
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {name}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{name} {size} failed ({}): {stdout}",
        output.status
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("{name} printed {line:?}"))
}

/// The bytes all kinds' stores hold, from a row's `stores`.
fn store_bytes(stores: &Value) -> Option<f64> {
    let kinds = stores.as_object()?;
    Some(kinds.values().filter_map(|k| k["bytes"].as_f64()).sum())
}

/// One Markdown row per size.
pub fn table(rows: &[Value]) -> String {
    let mut text = String::from(
        "| size, API server | nodes | pods | Services (endpoints) | policies | ready | RSS idle / churn | objects in the stores | CPU idle / churn | BPF maps | network programming p50 / p99 | EndpointSlice to maps p50 / p99 | policy implementation p50 / p99 | lists / watches | probes wrong |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let mib = |v: &Value| {
            v.as_f64()
                .map_or("-".into(), |b| format!("{:.0} MiB", b / 1048576.0))
        };
        let share = |v: &Value| {
            v.as_f64()
                .map_or("-".into(), |s| format!("{:.1}%", s * 100.0))
        };
        let ms = |v: &Value| {
            let q = |name: &str| v[name].as_f64().map_or("-".into(), |ms| format!("{ms:.1}"));
            format!("{} / {} ms", q("p50_ms"), q("p99_ms"))
        };
        let latency = &row["latency"];
        let size = row["size"].as_str().unwrap_or("?");
        let api = row["api"].as_str().unwrap_or("stub");
        text.push_str(&format!(
            "| {size}, {api} | {} | {} | {} ({}) | {} | {:.1} s | {} / {} | {} | {} / {} | {} | {} | {} | {} | {} / {} | {} of {} |\n",
            row["nodes"], row["pods"], row["services"], row["endpoints"], row["policies"],
            row["ready_secs"].as_f64().unwrap_or(f64::NAN),
            mib(&row["idle"]["rss_bytes"]), mib(&row["churn"]["rss_bytes"]),
            mib(&store_bytes(&row["stores"]).map_or(Value::Null, Value::from)),
            share(&row["idle"]["cpu_share"]), share(&row["churn"]["cpu_share"]),
            mib(&row["map_bytes"]),
            ms(&latency["network_programming"]),
            ms(&latency["endpoint_slice_to_maps"]),
            ms(&latency["policy_implementation"]),
            row["requests"]["lists"], row["requests"]["watches"],
            row["probes"]["wrong"], row["probes"]["count"],
        ));
    }
    text
}

//! Pods on two nodes over VXLAN: flatnet's fast path through the tunnel
//! against the same two simulated nodes set up as flannel's vxlan backend
//! does (a kernel VXLAN device, a route, a neighbour and an FDB entry per
//! peer, the host stack forwarding), and flatnet's direct routing beside
//! them. The tests crate's `flatnet-overlay-bench` builds and holds the
//! topologies (it links the simulated cluster, which xtask cannot); the
//! same clients as every other path measure them here, each path once per
//! round, the order rotated per round.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use super::control::median;
use super::paths::Pair;
use crate::util;

const BIN: &str = "flatnet-overlay-bench";

/// The paths, as the bench binary labels them; the first is the one the
/// targets are for, the last the baseline.
const LABELS: [&str; 3] = ["flatnet-vxlan", "flatnet-direct", "flannel-vxlan"];

/// One measurement of every path per round: (TCP Gbit/s, RTT p50 us, UDP
/// kpps) per label.
pub fn run(plugin_dir: &Path, rounds: usize, seconds: u32) -> anyhow::Result<Value> {
    util::build_debug()?;
    let bin_dir = util::plugins_with_agent(plugin_dir)?;
    let measured = measure(&bin_dir, rounds, seconds);
    let _ = std::fs::remove_dir_all(&bin_dir);
    measured
}

fn measure(bin_dir: &Path, rounds: usize, seconds: u32) -> anyhow::Result<Value> {
    let mut holder = Command::new(util::target_dir(false).join(BIN))
        .env("FLATNET_BIN_DIR", bin_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the overlay topologies")?;
    let mut line = String::new();
    let read = BufReader::new(holder.stdout.take().context("its stdout")?).read_line(&mut line);
    let measured = (|| -> anyhow::Result<Value> {
        read.context("reading the topologies")?;
        let listed: Value = serde_json::from_str(&line)
            .with_context(|| format!("the overlay bench printed {line:?}"))?;
        let mut pairs = Vec::new();
        for label in LABELS {
            let path = listed["paths"]
                .as_array()
                .and_then(|paths| paths.iter().find(|p| p["label"] == label))
                .with_context(|| format!("no path {label} in {listed}"))?;
            let field = |name: &str| path[name].as_str().unwrap_or_default();
            pairs.push(Pair::existing(
                label,
                (field("a"), field("ip_a")),
                (field("b"), field("ip_b")),
            )?);
        }
        let mut samples: Vec<Vec<[f64; 3]>> = vec![Vec::new(); pairs.len()];
        for round in 0..rounds {
            for offset in 0..pairs.len() {
                let index = (round + offset) % pairs.len();
                let pair = &pairs[index];
                let tcp = pair.tcp_throughput(seconds)?;
                let (rtt, _) = pair.tcp_latency(Duration::from_secs(u64::from(seconds)))?;
                let udp = pair.udp_rate(seconds)?;
                eprintln!(
                    "overlay round {}: {:<15} TCP {tcp:.2} Gbit/s, RTT p50 {rtt:.1} us, UDP {udp:.1} kpps",
                    round + 1,
                    pair.label
                );
                samples[index].push([tcp, rtt, udp]);
            }
        }
        let paths: serde_json::Map<String, Value> = LABELS
            .iter()
            .zip(&samples)
            .map(|(label, rounds)| {
                let column = |i: usize| rounds.iter().map(|s| s[i]).collect::<Vec<f64>>();
                (
                    label.to_string(),
                    json!({
                        "tcp_gbps": column(0),
                        "rtt_p50_us": column(1),
                        "udp_kpps": column(2),
                    }),
                )
            })
            .collect();
        let (date, commit) = util::date_and_commit();
        Ok(json!({
            "date": date,
            "commit": commit,
            "rounds": rounds,
            "seconds": seconds,
            "paths": paths,
        }))
    })();
    // Closing its stdin makes the holder remove everything.
    drop(holder.stdin.take());
    let status = holder
        .wait()
        .context("waiting for the overlay topologies")?;
    let measured = measured?;
    ensure!(
        status.success(),
        "the overlay bench's holder failed: {status}"
    );
    Ok(measured)
}

/// Prints the table and writes overlay.json into `out_dir`.
pub fn write(results: &Value, out_dir: &Path) -> anyhow::Result<()> {
    println!("{}", table(results));
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(
        out_dir.join("overlay.json"),
        serde_json::to_string_pretty(results)? + "\n",
    )?;
    Ok(())
}

/// The per-round values of `metric` on `label`.
fn values(results: &Value, label: &str, metric: &str) -> Vec<f64> {
    results["paths"][label][metric]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The median of the per-round ratios `label` / flannel's.
fn ratio(results: &Value, label: &str, metric: &str) -> f64 {
    let (mine, base) = (
        values(results, label, metric),
        values(results, LABELS[2], metric),
    );
    let mut ratios: Vec<f64> = mine
        .iter()
        .zip(&base)
        .filter(|(_, b)| **b > 0.0)
        .map(|(m, b)| m / b)
        .collect();
    if ratios.is_empty() {
        return f64::NAN;
    }
    median(&mut ratios)
}

/// The table: medians per path, flatnet's ratios to flannel's, targets.
pub fn table(results: &Value) -> String {
    let mut out = String::from(
        "| metric | flannel-style VXLAN | flatnet VXLAN | flatnet direct | flatnet VXLAN / flannel | flatnet direct / flannel | target (flatnet VXLAN) | |\n|---|---:|---:|---:|---:|---:|---|---|\n",
    );
    for (metric, name, target, met) in [
        (
            "tcp_gbps",
            "TCP throughput, 1 stream (Gbit/s)",
            ">= 1",
            (|r: f64| r >= 1.0) as fn(f64) -> bool,
        ),
        ("rtt_p50_us", "TCP round trip p50 (us)", "<= 0.95", |r| {
            r <= 0.95
        }),
        ("udp_kpps", "UDP 64 B received (kpps)", ">= 1.1", |r| {
            r >= 1.1
        }),
    ] {
        let medians: Vec<f64> = [LABELS[2], LABELS[0], LABELS[1]]
            .iter()
            .map(|label| {
                let mut v = values(results, label, metric);
                if v.is_empty() {
                    f64::NAN
                } else {
                    median(&mut v)
                }
            })
            .collect();
        let vxlan = ratio(results, LABELS[0], metric);
        let direct = ratio(results, LABELS[1], metric);
        out.push_str(&format!(
            "| {name} | {:.2} | {:.2} | {:.2} | {vxlan:.2} | {direct:.2} | {target} | {} |\n",
            medians[0],
            medians[1],
            medians[2],
            if met(vxlan) { "met" } else { "MISSED" }
        ));
    }
    out
}

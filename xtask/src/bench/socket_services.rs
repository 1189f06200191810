//! Services in eBPF against kube-proxy: the tests crate's
//! `flatnet-services-bench` (it links flatnet's library and the
//! kube-proxy fixture, which xtask cannot) measures connect + 64-byte
//! request/response to a ClusterIP with 10, 1,000 and 10,000 Services
//! through flatnet's socket programs and through kube-proxy's iptables and
//! nftables rules, and one update of each; then the same counts as
//! NodePorts reached from outside the cluster (flatnet's uplink program
//! against kube-proxy's NodePort rules); xtask keeps its JSON line and
//! renders the tables.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, ensure};
use plotters::prelude::{
    BitMapBackend, ChartBuilder, Color, IntoDrawingArea, RGBColor, Rectangle, Text, WHITE,
};
use serde_json::Value;

use crate::util;

const BIN: &str = "flatnet-services-bench";

/// Runs the measurement with the plugins of `plugin_dir`.
pub fn run(plugin_dir: &Path, seconds: f64, counts: &[usize]) -> anyhow::Result<Value> {
    util::build_debug()?;
    // The NodePort part runs agents from the plugins' directory: a release
    // build's agent is not static and lives beside it, not in it.
    let agent = plugin_dir.join(util::AGENT_PACKAGE);
    if !agent.exists() {
        let built = util::binary(true, util::AGENT_PACKAGE)?;
        std::os::unix::fs::symlink(&built, &agent).with_context(|| {
            format!("linking {} into {}", built.display(), plugin_dir.display())
        })?;
    }
    let out = Command::new(util::target_dir(false).join(BIN))
        .arg(seconds.to_string())
        .args(counts.iter().map(ToString::to_string))
        .env("FLATNET_BIN_DIR", plugin_dir)
        .output()
        .context("running the Services benchmark")?;
    ensure!(
        out.status.success(),
        "the Services benchmark failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).context("the Services benchmark's JSON line")
}

fn number(value: &Value) -> String {
    value
        .as_f64()
        .map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

/// Connections per second and p50 (us) of each path per Service count
/// (`first`: the count column's name), flatnet against itself at the
/// fewest Services and against each kube-proxy mode.
fn rate_table(first: &str, rows: &[Value]) -> String {
    let base = rows
        .first()
        .and_then(|r| r["ebpf"]["per_second"].as_f64())
        .unwrap_or(f64::NAN);
    let mut out = format!(
        "| {first} | flatnet eBPF conn/s | p50 us | kube-proxy iptables conn/s | p50 us | kube-proxy nftables conn/s | p50 us | eBPF / eBPF at fewest | eBPF / iptables | eBPF / nftables |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let rate = |path: &str| row[path]["per_second"].as_f64().unwrap_or(f64::NAN);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |\n",
            row["services"],
            number(&row["ebpf"]["per_second"]),
            number(&row["ebpf"]["p50_us"]),
            number(&row["iptables"]["per_second"]),
            number(&row["iptables"]["p50_us"]),
            number(&row["nftables"]["per_second"]),
            number(&row["nftables"]["p50_us"]),
            rate("ebpf") / base,
            rate("ebpf") / rate("iptables"),
            rate("ebpf") / rate("nftables"),
        ));
    }
    out
}

/// The markdown table of a run: per Service count, connections per second
/// and p50 (µs) of each path, flatnet against itself at the fewest
/// Services and against each kube-proxy mode, and the update times.
pub fn table(report: &Value) -> String {
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    let mut out = rate_table("Services", &rows);
    out.push_str("\n| Services | one EndpointSlice change: flatnet map update (us) | kube-proxy iptables-restore of the rule set (us) |\n|---:|---:|---:|\n");
    for update in report["updates"].as_array().cloned().unwrap_or_default() {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            update["services"],
            number(&update["map_update_us"]),
            number(&update["iptables_restore_us"]),
        ));
    }
    out.push_str(&nodeport_table(&report["nodeport"]));
    out
}

/// The NodePort tables: a client outside the cluster to a NodePort on one
/// node whose backend is on the other, per Service count and path; and
/// one update (flatnet: the agent's watch to the map; kube-proxy: its rule
/// set applied on the two nodes). Empty for a run without them.
fn nodeport_table(nodeport: &Value) -> String {
    let Some(rows) = nodeport["rows"].as_array() else {
        return String::new();
    };
    let mut out = String::from(
        "\nNodePort from outside the cluster, backend on the other node (connect + 64 B each way):\n\n",
    );
    out.push_str(&rate_table("NodePort Services", rows));
    out.push_str(&ceiling_table(rows));
    out.push_str("\n| NodePort Services | one EndpointSlice change: flatnet agent to map (us) | kube-proxy iptables rules on two nodes (us) | kube-proxy nftables rules on two nodes (us) |\n|---:|---:|---:|---:|\n");
    for update in nodeport["updates"].as_array().cloned().unwrap_or_default() {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            update["services"],
            number(&update["agent_update_us"]),
            number(&update["iptables_apply_us"]),
            number(&update["nftables_apply_us"]),
        ));
    }
    out
}

/// How far any translation on the NodePort's node could take the eBPF
/// rate: the client makes one connection at a time, so a connection takes
/// 1 / rate; take away all the time cp-1's programs ran for it (what a
/// translation that cost nothing would save) and divide by nftables'.
fn ceiling_table(rows: &[Value]) -> String {
    let mut out = String::from(
        "
| NodePort Services | cp-1's BPF programs per connection (ns) | their runs per connection | ns per run of `from_uplink` (with `nodeport_in`) | eBPF / nftables with them free (ceiling) |
|---:|---:|---:|---:|---:|
",
    );
    for row in rows {
        let bpf_ns = row["ebpf_cp1_bpf_ns_per_connection"]
            .as_f64()
            .unwrap_or(f64::NAN);
        let ebpf = row["ebpf"]["per_second"].as_f64().unwrap_or(f64::NAN);
        let nftables = row["nftables"]["per_second"].as_f64().unwrap_or(f64::NAN);
        let ceiling = 1.0 / (1.0 / ebpf - bpf_ns * 1e-9) / nftables;
        // Per program (pinned under the datapath's id): the runs of all of
        // them, and the uplink's ingress program's time per run.
        let programs = row["ebpf_cp1_programs"].as_object();
        let runs: f64 = programs
            .iter()
            .flat_map(|p| p.values())
            .filter_map(|p| p["runs_per_connection"].as_f64())
            .sum();
        let uplink_ns = programs
            .and_then(|p| p.iter().find(|(name, _)| name.starts_with("from_uplink")))
            .map_or(Value::Null, |(_, p)| p["ns_per_run"].clone());
        out.push_str(&format!(
            "| {} | {} | {runs:.1} | {} | {ceiling:.2} |
",
            row["services"],
            number(&row["ebpf_cp1_bpf_ns_per_connection"]),
            number(&uplink_ns),
        ));
    }
    out
}

/// A bar chart of the run: connections per second per Service count, one
/// bar per path.
pub fn chart(report: &Value, path: &Path) -> anyhow::Result<()> {
    super::chart::register_font()?;
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    let paths = [
        ("ebpf", "flatnet eBPF", RGBColor(46, 139, 87)),
        ("iptables", "kube-proxy iptables", RGBColor(230, 140, 40)),
        ("nftables", "kube-proxy nftables", RGBColor(70, 110, 190)),
    ];
    let top = rows
        .iter()
        .flat_map(|row| {
            paths
                .iter()
                .filter_map(|(key, _, _)| row[*key]["per_second"].as_f64())
        })
        .fold(1.0_f64, f64::max)
        * 1.2;
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Connections per second to a ClusterIP (connect + 64 B each way), by Services installed",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(10)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..rows.len() as f64, -top * 0.1..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("connections per second")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, row) in rows.iter().enumerate() {
        for (j, (key, _, color)) in paths.iter().enumerate() {
            let Some(rate) = row[*key]["per_second"].as_f64() else {
                continue;
            };
            let x = i as f64 + 0.1 + j as f64 * 0.27;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x, 0.0), (x + 0.24, rate)],
                color.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{rate:.0}"),
                (x, rate + top * 0.02),
                ("sans-serif", 13),
            )))?;
        }
        chart.draw_series(std::iter::once(Text::new(
            format!("{} Services", row["services"]),
            (i as f64 + 0.35, -top * 0.04),
            ("sans-serif", 15),
        )))?;
    }
    for (j, (_, label, color)) in paths.iter().enumerate() {
        let y = top * (0.97 - 0.06 * j as f64);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.05, y), (0.12, y - top * 0.035)],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            label.to_string(),
            (0.15, y),
            ("sans-serif", 14),
        )))?;
    }
    root.present()?;
    Ok(())
}

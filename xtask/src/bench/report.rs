//! The benchmark's report: medians and median ratios against the targets,
//! as a terminal table, a markdown file, raw JSON and a PNG chart.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::Context;
use plotters::prelude::{
    BLACK, BLUE, BitMapBackend, ChartBuilder, Color, FontStyle, IntoDrawingArea, PathElement,
    RGBColor, Rectangle, Text, WHITE,
};

use super::control::{CniTimes, ipam_concurrent};
use super::figures::{number, ratio_median, value_median};
use super::samples::{DataSample, Round};
use crate::util::{self, heading};

pub struct Config {
    pub rounds: usize,
    pub seconds: u32,
    pub sequential: usize,
    pub concurrent: usize,
    pub flatnet_ipam: String,
    /// `--before`'s commit, abbreviated.
    pub before: Option<String>,
}

/// How a ratio flatnet/other must compare with its bound.
#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

impl Bound {
    fn met(self, ratio: f64) -> bool {
        match self {
            Bound::AtMost(limit) => ratio <= limit,
            Bound::AtLeast(limit) => ratio >= limit,
        }
    }

    fn text(self) -> String {
        match self {
            Bound::AtMost(limit) => format!("<= {limit}"),
            Bound::AtLeast(limit) => format!(">= {limit}"),
        }
    }
}

/// One line of the report.
pub(super) struct Row {
    metric: &'static str,
    /// The bar's label in the chart: two short lines.
    chart_label: [&'static str; 2],
    bridge: f64,
    flatnet: f64,
    /// flatnet in XDP mode (data plane only).
    xdp: Option<f64>,
    veth: Option<f64>,
    /// The bare veth pair with flatnet's BIG TCP limits.
    veth_big: Option<f64>,
    /// Median over rounds of the per-round ratio flatnet/bridge.
    vs_bridge: f64,
    vs_veth: Option<f64>,
    vs_veth_big: Option<f64>,
    xdp_vs_bridge: Option<f64>,
    target_bridge: Option<Bound>,
    target_veth: Option<Bound>,
    target_veth_big: Option<Bound>,
}

impl Row {
    fn verdict(&self) -> &'static str {
        let checks = [
            self.target_bridge.map(|b| b.met(self.vs_bridge)),
            self.target_veth.zip(self.vs_veth).map(|(b, r)| b.met(r)),
            self.target_veth_big
                .zip(self.vs_veth_big)
                .map(|(b, r)| b.met(r)),
        ];
        if checks.iter().all(Option::is_none) {
            ""
        } else if checks.iter().flatten().all(|ok| *ok) {
            "met"
        } else {
            "MISSED"
        }
    }
}

pub(super) fn rows(results: &[Round], config: &Config) -> Vec<Row> {
    type DataPick = fn(&DataSample) -> f64;
    type CniPick = fn(&CniTimes) -> f64;
    // Targets against bridge, the default veth pair, the BIG TCP one.
    type Targets = (Option<Bound>, Option<Bound>, Option<Bound>);
    let none: Targets = (None, None, None);
    let data_metrics: [(&str, DataPick, Targets); 7] = [
        (
            "TCP throughput, 1 stream (Gbit/s)",
            |d| d.tcp_gbps,
            (
                Some(Bound::AtLeast(1.0)),
                Some(Bound::AtLeast(1.10)),
                Some(Bound::AtLeast(0.97)),
            ),
        ),
        (
            "TCP round trip p50 (us)",
            |d| d.rr_p50_us,
            (Some(Bound::AtMost(0.88)), Some(Bound::AtMost(1.03)), None),
        ),
        ("TCP round trip p99 (us)", |d| d.rr_p99_us, none),
        (
            "UDP 64 B received (kpps)",
            |d| d.udp_kpps,
            (Some(Bound::AtLeast(1.2)), Some(Bound::AtLeast(1.0)), None),
        ),
        (
            "TCP round trip p50 through a ClusterIP, kube-proxy iptables rules (us)",
            |d| d.clusterip_rr_p50_us,
            none,
        ),
        (
            "datapath program per packet, 64 B UDP (ns, bpf_stats)",
            |d| d.program_ns,
            none,
        ),
        (
            "datapath program per packet, TCP stream (ns, bpf_stats)",
            |d| d.program_tcp_ns,
            none,
        ),
    ];
    let sequential = format!("{} one after another", config.sequential);
    let concurrent = format!("{} at once", config.concurrent);
    let ipam_concurrent = format!("{} at once", ipam_concurrent(config.concurrent));
    let cni_metrics: [(String, CniPick, &str); 8] = [
        (
            format!("CNI ADD, {sequential} (ms/pod)"),
            |t| t.add_sequential,
            "flatnet",
        ),
        (
            format!("CNI DEL, {sequential} (ms/pod)"),
            |t| t.del_sequential,
            "flatnet",
        ),
        (
            format!("CNI ADD, {concurrent} (ms/pod)"),
            |t| t.add_concurrent,
            "flatnet",
        ),
        (
            format!("CNI DEL, {concurrent} (ms/pod)"),
            |t| t.del_concurrent,
            "flatnet",
        ),
        (
            format!("IPAM alone, host-local vs flatnet-ipam: ADD, {sequential} (ms)"),
            |t| t.ipam_add_sequential,
            "flatnet",
        ),
        (
            format!("IPAM alone, host-local vs flatnet-ipam: ADD, {ipam_concurrent} (ms/pod)"),
            |t| t.ipam_add_concurrent,
            "flatnet",
        ),
        (
            format!("IPAM alone, flatnet-ipam with \"fsync\": false: ADD, {sequential} (ms)"),
            |t| t.ipam_add_sequential,
            "flatnet-nofsync",
        ),
        (
            format!(
                "IPAM alone, flatnet-ipam with \"fsync\": false: ADD, {ipam_concurrent} (ms/pod)"
            ),
            |t| t.ipam_add_concurrent,
            "flatnet-nofsync",
        ),
    ];
    const DATA_LABELS: [[&str; 2]; 7] = [
        ["TCP", "throughput"],
        ["TCP RTT", "p50"],
        ["TCP RTT", "p99"],
        ["UDP 64 B", "rate"],
        ["ClusterIP", "RTT p50"],
        ["program", "ns, UDP"],
        ["program", "ns, TCP"],
    ];
    const CNI_LABELS: [[&str; 2]; 8] = [
        ["ADD", "in turn"],
        ["DEL", "in turn"],
        ["ADD", "at once"],
        ["DEL", "at once"],
        ["IPAM ADD", "in turn"],
        ["IPAM ADD", "at once"],
        ["IPAM, no", "fsync, turn"],
        ["IPAM, no", "fsync, once"],
    ];
    let mut rows = Vec::new();
    for ((metric, pick, (target_bridge, target_veth, target_veth_big)), chart_label) in
        data_metrics.into_iter().zip(DATA_LABELS)
    {
        let value = move |round: &Round, path: &str| round.data.get(path).map(pick);
        rows.push(Row {
            metric,
            chart_label,
            bridge: value_median(results, &value, "bridge"),
            flatnet: value_median(results, &value, "flatnet"),
            xdp: Some(value_median(results, &value, "flatnet-xdp")).filter(|v| !v.is_nan()),
            veth: Some(value_median(results, &value, "veth")).filter(|v| !v.is_nan()),
            veth_big: Some(value_median(results, &value, "veth-big")).filter(|v| !v.is_nan()),
            vs_bridge: ratio_median(results, value, "flatnet", "bridge").unwrap_or(f64::NAN),
            vs_veth: ratio_median(results, value, "flatnet", "veth").filter(|v| !v.is_nan()),
            vs_veth_big: ratio_median(results, value, "flatnet", "veth-big")
                .filter(|v| !v.is_nan()),
            xdp_vs_bridge: ratio_median(results, value, "flatnet-xdp", "bridge")
                .filter(|v| !v.is_nan()),
            target_bridge,
            target_veth,
            target_veth_big,
        });
    }
    for ((metric, pick, path), chart_label) in cni_metrics.into_iter().zip(CNI_LABELS) {
        let value = move |round: &Round, path: &str| round.cni.get(path).map(pick);
        rows.push(Row {
            metric: Box::leak(metric.into_boxed_str()),
            chart_label,
            bridge: value_median(results, &value, "bridge"),
            flatnet: value_median(results, &value, path),
            xdp: None,
            veth: None,
            veth_big: None,
            vs_bridge: ratio_median(results, value, path, "bridge").unwrap_or(f64::NAN),
            vs_veth: None,
            vs_veth_big: None,
            xdp_vs_bridge: None,
            target_bridge: Some(Bound::AtMost(0.5)),
            target_veth: None,
            target_veth_big: None,
        });
    }
    rows
}

/// NetworkPolicy's cost: the pair 100 policies select against the plain
/// flatnet pair, same rounds, within 5% (issue 15's target).
/// A data-plane metric: its name, how it is read and its bound.
type DataMetric = (&'static str, fn(&DataSample) -> f64, Option<Bound>);

pub(super) fn policy_table(results: &[Round]) -> String {
    let metrics: [DataMetric; 5] = [
        (
            "TCP throughput (Gbit/s)",
            |d| d.tcp_gbps,
            Some(Bound::AtLeast(0.95)),
        ),
        (
            "TCP RTT p50 (us)",
            |d| d.rr_p50_us,
            Some(Bound::AtMost(1.05)),
        ),
        (
            "UDP 64 B (kpps)",
            |d| d.udp_kpps,
            Some(Bound::AtLeast(0.95)),
        ),
        ("program ns/packet, UDP", |d| d.program_ns, None),
        ("program ns/packet, TCP", |d| d.program_tcp_ns, None),
    ];
    let mut out = format!(
        "| metric | flatnet, no policy | flatnet, {} policies | policy/none | target | |\n\
         |---|---:|---:|---:|---|---|\n",
        super::policy::POLICIES
    );
    for (metric, pick, target) in metrics {
        let value = move |round: &Round, path: &str| round.data.get(path).map(pick);
        let ratio = ratio_median(results, value, super::policy::LABEL, "flatnet");
        let verdict = match (target, ratio) {
            (Some(bound), Some(r)) if bound.met(r) => "met",
            (Some(_), Some(_)) => "MISSED",
            _ => "",
        };
        let _ = writeln!(
            out,
            "| {metric} | {} | {} | {} | {} | {verdict} |",
            number(value_median(results, &value, "flatnet")),
            number(value_median(results, &value, super::policy::LABEL)),
            ratio.map(number).unwrap_or_else(|| "-".into()),
            target.map(Bound::text).unwrap_or_default(),
        );
    }
    out
}

fn machine() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory = read("/proc/meminfo")
        .lines()
        .next()
        .unwrap_or_default()
        .replace("MemTotal:", "")
        .trim()
        .to_string();
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    format!("{cores} cores ({cpu}), {memory} RAM, Linux {kernel}")
}

fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(util::root())
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!(
        "{head}{}",
        if dirty {
            " (with uncommitted changes)"
        } else {
            ""
        }
    )
}

pub(super) fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| metric | bridge | flatnet (tc) | flatnet-xdp | veth | veth, BIG TCP | flatnet/bridge | flatnet/veth | flatnet/veth BIG TCP | xdp/bridge | target (flatnet tc) | |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
    );
    let opt = |v: Option<f64>| v.map(number).unwrap_or_else(|| "-".into());
    for row in rows {
        let target = [
            row.target_bridge.map(|b| format!("bridge {}", b.text())),
            row.target_veth.map(|b| format!("veth {}", b.text())),
            row.target_veth_big
                .map(|b| format!("veth BIG TCP {}", b.text())),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.metric,
            number(row.bridge),
            number(row.flatnet),
            opt(row.xdp),
            opt(row.veth),
            opt(row.veth_big),
            number(row.vs_bridge),
            opt(row.vs_veth),
            opt(row.vs_veth_big),
            opt(row.xdp_vs_bridge),
            target,
            row.verdict()
        );
    }
    out
}

/// DejaVuSans as the charts' "sans-serif", registered once per process.
pub(super) fn register_font() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if REGISTERED.get().is_some() {
        return Ok(());
    }
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("the chart needs DejaVuSans (Debian package fonts-dejavu-core)")?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("DejaVuSans.ttf is not a usable font"))?;
    let _ = REGISTERED.set(true);
    Ok(())
}

fn chart(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let ratios: Vec<([&str; 2], f64, Option<Bound>)> = rows
        .iter()
        .filter(|r| !r.vs_bridge.is_nan())
        .map(|r| (r.chart_label, r.vs_bridge, r.target_bridge))
        .collect();
    let top = ratios.iter().map(|(_, v, _)| *v).fold(1.5_f64, f64::max) * 1.15;
    let root = BitMapBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "flatnet (tc) / kernel bridge: median ratio per metric (bars), target (black tick), 1.0 (blue)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(10)
        .y_label_area_size(60)
        // Below zero: room for the bars' labels.
        .build_cartesian_2d(0f64..ratios.len() as f64, -top * 0.16..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("flatnet / bridge")
        .label_style(("sans-serif", 16))
        .draw()?;
    for (i, (label, ratio, bound)) in ratios.iter().enumerate() {
        let x = i as f64;
        let color = match bound {
            Some(b) if b.met(*ratio) => RGBColor(46, 139, 87),
            Some(_) => RGBColor(200, 60, 50),
            None => RGBColor(120, 120, 120),
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, *ratio)],
            color.filled(),
        )))?;
        if let Some(Bound::AtMost(limit) | Bound::AtLeast(limit)) = bound {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x + 0.1, *limit), (x + 0.9, *limit)],
                BLACK.stroke_width(3),
            )))?;
        }
        chart.draw_series(std::iter::once(Text::new(
            format!("{ratio:.2}"),
            (x + 0.35, ratio + top * 0.02),
            ("sans-serif", 16),
        )))?;
        for (line, text) in label.iter().enumerate() {
            chart.draw_series(std::iter::once(Text::new(
                text.to_string(),
                (x + 0.08, -top * (0.03 + 0.06 * line as f64)),
                ("sans-serif", 14),
            )))?;
        }
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 1.0), (ratios.len() as f64, 1.0)],
        BLUE.mix(0.4),
    )))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 0.0), (ratios.len() as f64, 0.0)],
        BLACK,
    )))?;
    root.present()?;
    Ok(())
}

pub fn write(results: &[Round], config: &Config, dir: &Path) -> anyhow::Result<()> {
    let rows = rows(results, config);
    let table = table(&rows);
    let when = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let commit = commit();
    let machine = machine();
    let mut md = format!(
        "# flatnet benchmark\n\n{when}; commit {commit}; {machine}.\n\n{} interleaved round(s) (bridge, flatnet, flatnet-xdp, veth, veth BIG TCP), {} s per data-plane measurement; \
         control plane: {} pods one after another and {} at once per round, with one pod already attached. \
         bridge = reference `bridge` plugin (isGateway) + `host-local`; flatnet = tc datapath + `{}` (release builds, linked statically); flatnet-xdp = the XDP datapath (data plane only); veth = a bare veth pair between the two namespaces; veth, BIG TCP = the same with flatnet's `bigTcp` GSO/GRO limits (524280) on both ends. \
         TCP round trips: 64-byte ping-pong, blocking sockets, client and server on one CPU, in 0.3 s slices taken in turn per path (this VM flips between a fast and a slow state every few seconds). \
         Throughput and UDP: iperf3, client on CPU 0, server on CPU 1. \
         Values are medians over rounds; ratios are medians of the per-round ratios.\n\n",
        config.rounds, config.seconds, config.sequential, config.concurrent, config.flatnet_ipam,
    );
    md.push_str(&table);
    md.push_str("\n![ratios](bench.png)\n");
    let policy = policy_table(results);
    md.push_str(&format!(
        "\n## NetworkPolicy\n\nflatnet, {} policies: a second flatnet pair whose two pods every policy selects (isolated for ingress and egress; each policy allows the benchmark's traffic and peers and ports of its own), written by the agent's computation and sync (`flatnet-policy-fixture`). Same rounds as the plain pair.\n\n{policy}",
        super::policy::POLICIES
    ));
    md.push_str(&format!(
        "\n## Before and after\n\nThis build against {}'s, same rounds (its plain pair and its ClusterIP path).\n\n{}",
        config.before.as_deref().map_or("no earlier build (no `--before`)".to_string(), |c| format!("commit {c}")),
        super::before::table(results)
    ));
    let variants = super::variants::table(results);
    md.push_str(&format!(
        "\n## Where the nanoseconds go under load\n\nflatnet's `from_pod` cut down, each variant in front of the deployed program on pod a's host veth (`flatnet-cost-variant`), in the same UDP flood and TCP stream.\n\n{variants}"
    ));
    heading("results");
    println!("{table}");
    heading("NetworkPolicy: 100 policies on the pair vs none");
    println!("{policy}");
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("bench.md"), &md)?;
    let raw: Vec<_> = results
        .iter()
        .map(|round| {
            serde_json::json!({
                "data": round.data,
                "variants": round.variants,
                "cni": round.cni.iter().map(|(k, t)| (k.to_string(), serde_json::json!({
                    "add_sequential_ms": t.add_sequential, "del_sequential_ms": t.del_sequential,
                    "add_concurrent_ms_per_pod": t.add_concurrent, "del_concurrent_ms_per_pod": t.del_concurrent,
                    "ipam_add_sequential_ms": t.ipam_add_sequential, "ipam_add_concurrent_ms_per_pod": t.ipam_add_concurrent,
                }))).collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    // The run's description beside its rounds: `cargo xtask docs` writes
    // docs/benchmarks.md and the README's table from this file alone.
    let bench = serde_json::json!({
        "run": {
            "date": when,
            "commit": commit,
            "machine": machine,
            "rounds": config.rounds,
            "seconds": config.seconds,
            "sequential": config.sequential,
            "concurrent": config.concurrent,
            "flatnet_ipam": config.flatnet_ipam,
            "before": config.before,
        },
        "rounds": raw,
    });
    std::fs::write(
        dir.join("bench.json"),
        serde_json::to_string_pretty(&bench)?,
    )?;
    chart(&rows, &dir.join("bench.png"))?;
    println!("report: {}", dir.join("bench.md").display());
    Ok(())
}

//! The report's rows and tables: for each metric, the paths' medians and
//! flatnet's median ratios to them, judged against the targets (`Bound`),
//! in the main table and NetworkPolicy's. Both the run's report (`report`)
//! and the committed docs (`page`) print them.

use std::fmt::Write as _;

use super::control::{CniTimes, ipam_concurrent};
use super::figures::{number, ratio_median, value_median};
use super::samples::{DataSample, Round};

/// What the run was asked for: the rows' labels name its pod counts.
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
pub(super) enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

impl Bound {
    pub(super) fn met(self, ratio: f64) -> bool {
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
    pub(super) chart_label: [&'static str; 2],
    bridge: f64,
    flatnet: f64,
    /// flatnet in XDP mode (data plane only).
    xdp: Option<f64>,
    veth: Option<f64>,
    /// The bare veth pair with flatnet's BIG TCP limits.
    veth_big: Option<f64>,
    /// Median over rounds of the per-round ratio flatnet/bridge.
    pub(super) vs_bridge: f64,
    vs_veth: Option<f64>,
    vs_veth_big: Option<f64>,
    xdp_vs_bridge: Option<f64>,
    pub(super) target_bridge: Option<Bound>,
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

/// A data-plane metric: its name, how it is read and its bound.
type DataMetric = (&'static str, fn(&DataSample) -> f64, Option<Bound>);

/// NetworkPolicy's cost: the pair 100 policies select against the plain
/// flatnet pair, same rounds, within 5% (issue 15's target).
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

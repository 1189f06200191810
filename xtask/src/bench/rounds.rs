//! The bench's interleaved rounds: every path set up once (`path_setup`),
//! then in each round their latency, throughput, ClusterIP and program
//! cost, flatnet's program variants, and the IPAM and CNI timings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use super::before;
use super::control::{self, CniTimes, ipam_concurrent};
use super::path_setup::{
    ControlPlanePlugins, Plugins, control_plane_plugins, set_up_pairs, set_up_service_paths,
};
use super::paths::{self, Pair};
use super::program_stats::{measured_program, with_pinned_program_cost, with_program_cost};
use super::samples::{DataSample, Round};
use super::services::{self, ServicePaths};
use super::variants;
use crate::cni::Plugin;
use crate::install::REFERENCE_PLUGINS;

/// How much each round measures.
pub(super) struct Sizes {
    pub rounds: usize,
    pub seconds: u32,
    pub sequential: usize,
    pub concurrent: usize,
}

/// Sets every path up, then measures `sizes.rounds` rounds of them.
pub(super) fn measure_rounds(
    plugins: &Plugins,
    sizes: &Sizes,
    policy_fixture: &PathBuf,
    variant_fixture: &Path,
) -> anyhow::Result<Vec<Round>> {
    let pairs = set_up_pairs(plugins, policy_fixture)?;
    let service_paths = set_up_service_paths(plugins)?;
    let control_plane = control_plane_plugins(plugins);
    let mut results = Vec::new();
    for round in 1..=sizes.rounds {
        results.push(measure_round(
            round,
            plugins,
            sizes,
            &pairs,
            &service_paths,
            &control_plane,
            variant_fixture,
        )?);
    }
    Ok(results)
}

/// One round of every measurement, in this order.
fn measure_round(
    round: usize,
    plugins: &Plugins,
    sizes: &Sizes,
    pairs: &[Pair],
    service_paths: &ServicePaths,
    control_plane: &ControlPlanePlugins,
    variant_fixture: &Path,
) -> anyhow::Result<Round> {
    let mut sample = Round::default();
    let slice = Duration::from_millis(300);
    let (mut latency, mut clusterip) = measure_latency(pairs, service_paths, sizes.seconds, slice)?;
    let clusterip_program = measure_clusterip_program(service_paths, slice)?;
    for pair in pairs {
        let data = measure_data_plane(
            round,
            pair,
            sizes.seconds,
            &mut latency,
            &mut clusterip,
            &clusterip_program,
        )?;
        sample.data.insert(pair.label, data);
    }
    // The program's parts: its variants on the plain flatnet pair.
    let flatnet_pair = pairs
        .iter()
        .find(|pair| pair.label == "flatnet")
        .context("the flatnet pair")?;
    println!("round {round} flatnet's program variants:");
    sample.variants = variants::measure(
        variant_fixture,
        flatnet_pair,
        measured_program("flatnet").context("flatnet's network")?.0,
        sizes.seconds,
        round,
    )?;
    let ipam_times = measure_ipam_alone(round, plugins, sizes, control_plane)?;
    let (nofsync_sequential, nofsync_concurrent) = ipam_times["flatnet-nofsync"];
    sample.cni.insert(
        "flatnet-nofsync",
        CniTimes {
            ipam_add_sequential: nofsync_sequential,
            ipam_add_concurrent: nofsync_concurrent,
            ..CniTimes::default()
        },
    );
    measure_cni(round, sizes, control_plane, &ipam_times, &mut sample)?;
    Ok(sample)
}

/// Round-trip latency samples per path, p50s and p99s, and the ClusterIP
/// paths' p50s.
type LatencySamples = BTreeMap<&'static str, (Vec<f64>, Vec<f64>)>;
type ClusterIpSamples = BTreeMap<&'static str, Vec<f64>>;

fn measure_latency(
    pairs: &[Pair],
    service_paths: &ServicePaths,
    seconds: u32,
    slice: Duration,
) -> anyhow::Result<(LatencySamples, ClusterIpSamples)> {
    // Latency in short slices taken in turn (see pingpong.rs), medians per path.
    let slices = (seconds as usize * 3).max(3);
    let mut latency: LatencySamples = BTreeMap::new();
    let mut clusterip: ClusterIpSamples = BTreeMap::new();
    for _ in 0..slices {
        for pair in pairs {
            let (p50, p99) = pair.tcp_latency(slice)?;
            let entry = latency.entry(pair.label).or_default();
            entry.0.push(p50);
            entry.1.push(p99);
        }
        for label in service_paths.labels() {
            let (p50, _) = service_paths.round_trip(label, paths::SERVER_CPU, slice)?;
            clusterip.entry(label).or_default().push(p50);
        }
    }
    Ok((latency, clusterip))
}

/// The program's cost on ClusterIP traffic, in one slice of its own per
/// flatnet build (BPF statistics off for the others).
fn measure_clusterip_program(
    service_paths: &ServicePaths,
    slice: Duration,
) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let mut clusterip_program = BTreeMap::new();
    for (label, network) in [
        ("flatnet", before::SERVICE_NETWORK),
        (before::LABEL, before::SERVICE_NETWORK_BEFORE),
    ] {
        if service_paths.labels().contains(&label) {
            let dir = services::pin_dir(network);
            let (_, ns) = with_pinned_program_cost(&dir, "from_pod", || {
                service_paths.round_trip(label, paths::SERVER_CPU, slice)
            })?;
            clusterip_program.insert(label, ns);
        }
    }
    Ok(clusterip_program)
}

/// `pair`'s throughput and program costs, with the medians of its latency
/// samples.
fn measure_data_plane(
    round: usize,
    pair: &Pair,
    seconds: u32,
    latency: &mut LatencySamples,
    clusterip: &mut ClusterIpSamples,
    clusterip_program: &BTreeMap<&'static str, f64>,
) -> anyhow::Result<DataSample> {
    let (p50s, p99s) = latency.get_mut(pair.label).context("latency samples")?;
    let (tcp_gbps, program_tcp_ns, _) =
        with_program_cost(pair.label, || pair.tcp_throughput(seconds))?;
    let (udp_kpps, program_ns, program_floor_ns) =
        with_program_cost(pair.label, || pair.udp_rate(seconds))?;
    let data = DataSample {
        tcp_gbps,
        rr_p50_us: control::median(p50s),
        rr_p99_us: control::median(p99s),
        udp_kpps,
        clusterip_rr_p50_us: clusterip
            .get_mut(pair.label)
            .map_or(f64::NAN, |p50s| control::median(p50s)),
        program_ns,
        program_tcp_ns,
        clusterip_program_ns: clusterip_program
            .get(pair.label)
            .copied()
            .unwrap_or(f64::NAN),
        program_floor_ns,
    };
    println!(
        "round {round} {:<8} tcp {:6.2} Gbit/s  rr p50 {:6.1} us  p99 {:6.1} us  udp {:7.1} kpps  clusterip rr p50 {:6.1} us  program {:5.0} ns/pkt (udp) {:5.0} (tcp) {:5.0} (clusterip)",
        pair.label,
        data.tcp_gbps,
        data.rr_p50_us,
        data.rr_p99_us,
        data.udp_kpps,
        data.clusterip_rr_p50_us,
        data.program_ns,
        data.program_tcp_ns,
        data.clusterip_program_ns
    );
    Ok(data)
}

/// IPAM plugins alone, right after the data plane (no namespace teardown
/// still running in the kernel), one after the other. flatnet-ipam also
/// without fsync: on this VM a flush costs 0.1 to 1 ms, so the report
/// shows what the default (flushed) costs. (sequential, concurrent) ADD
/// times by label.
fn measure_ipam_alone(
    round: usize,
    plugins: &Plugins,
    sizes: &Sizes,
    control_plane: &ControlPlanePlugins,
) -> anyhow::Result<BTreeMap<&'static str, (f64, f64)>> {
    let mut ipam_times = BTreeMap::new();
    for (label, plugin) in [
        ("bridge", &control_plane.bridge),
        ("flatnet", &control_plane.flatnet),
        ("flatnet-nofsync", &control_plane.flatnet),
    ] {
        let ipam = if label == "bridge" {
            "host-local"
        } else {
            plugins.flatnet_ipam
        };
        let ipam_dir = plugins.data_dir.join(format!("ipam-{label}"));
        let ipam_plugin = Plugin::new(
            if ipam == "host-local" {
                PathBuf::from(REFERENCE_PLUGINS).join(ipam)
            } else {
                plugins.bin.join(ipam)
            },
            &plugins.cni_path,
            ipam_only(&plugin.conf, &ipam_dir, label == "flatnet-nofsync"),
        );
        let times = control::measure_ipam(
            &ipam_plugin,
            sizes.sequential,
            ipam_concurrent(sizes.concurrent),
            &ipam_dir,
        )?;
        println!(
            "round {round} {:<21} alone: ADD {:5.2} ms, x{} at once {:5.2} ms/pod",
            if label == "flatnet-nofsync" {
                "flatnet-ipam no fsync"
            } else {
                ipam
            },
            times.0,
            ipam_concurrent(sizes.concurrent),
            times.1
        );
        ipam_times.insert(label, times);
    }
    Ok(ipam_times)
}

/// CNI ADD and DEL of the whole plugins, one pod after another and many
/// at once, with the IPAM-alone times beside them.
fn measure_cni(
    round: usize,
    sizes: &Sizes,
    control_plane: &ControlPlanePlugins,
    ipam_times: &BTreeMap<&'static str, (f64, f64)>,
    sample: &mut Round,
) -> anyhow::Result<()> {
    let concurrent = sizes.concurrent;
    for (label, plugin) in [
        ("bridge", &control_plane.bridge),
        ("flatnet", &control_plane.flatnet),
    ] {
        let mut times = control::measure(label, plugin, sizes.sequential, concurrent)?;
        (times.ipam_add_sequential, times.ipam_add_concurrent) = ipam_times[label];
        println!(
            "round {round} {label:<8} ADD {:5.2} ms  DEL {:5.2} ms  (x{concurrent} at once: ADD {:5.2} ms/pod  DEL {:5.2} ms/pod)",
            times.add_sequential, times.del_sequential, times.add_concurrent, times.del_concurrent,
        );
        sample.cni.insert(label, times);
    }
    Ok(())
}

/// The same network configuration for an IPAM plugin run on its own, with
/// a data dir of its own and room for every concurrent ADD (a /22).
fn ipam_only(conf: &str, data_dir: &std::path::Path, no_fsync: bool) -> String {
    let mut value: serde_json::Value = serde_json::from_str(conf).unwrap_or_default();
    value["ipam"]["dataDir"] = json!(data_dir);
    if no_fsync {
        value["ipam"]["fsync"] = json!(false);
    }
    if let Some(subnet) = value["ipam"]["subnet"].as_str() {
        value["ipam"]["subnet"] = json!(subnet.replace(".0/24", ".0/22"));
    }
    value.to_string()
}

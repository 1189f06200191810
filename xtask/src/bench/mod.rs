//! `cargo xtask bench`: flatnet against the reference bridge plugin and a
//! bare veth pair, interleaved round by round in one run, reported as
//! median ratios (the noise of a shared 2-core machine cancels in them).

mod before;
mod control;
mod cri;
pub mod docs;
mod gso;
mod overlay;
mod paths;
mod pingpong;
mod policy;
mod program_cost;
mod report;
mod services;
mod socket_services;
mod variants;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde_json::json;

use crate::cni::Plugin;
use crate::install::REFERENCE_PLUGINS;
use crate::util::{self, heading};
pub use control::CniTimes;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds (bridge, flatnet, veth, bridge, ...).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds per data-plane measurement.
    #[arg(long, default_value_t = 3)]
    pub seconds: u32,
    /// Pods added (and deleted) one after another per round and plugin.
    #[arg(long, default_value_t = 50)]
    pub sequential: usize,
    /// Pods added (and deleted) all at once per round and plugin.
    #[arg(long, default_value_t = 32)]
    pub concurrent: usize,
    /// One short round on the debug build: a smoke test of the benchmark
    /// itself (used by `cargo xtask test`).
    #[arg(long)]
    pub smoke: bool,
    /// Where the report goes (default: results/, or a temp dir with --smoke).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Only `from_pod`'s cost per frame kind (a minute): into
    /// program-cost.json and docs/benchmarks.md, for work on the datapath.
    #[arg(long)]
    pub program_cost: bool,
    /// Only the overlay section (pods on two nodes over VXLAN, flatnet
    /// against flannel's vxlan backend; `--rounds`, `--seconds`): into
    /// overlay.json and docs/benchmarks.md.
    #[arg(long)]
    pub overlay: bool,
    /// Only the Services section (ClusterIPs at the socket and NodePorts
    /// from outside, against kube-proxy's iptables and nftables rules, at
    /// 10, 1,000 and 10,000 Services; `--seconds`): into services.json and
    /// docs/benchmarks.md.
    #[arg(long)]
    pub services: bool,
    /// An earlier commit whose build is measured beside this one's, in the
    /// same rounds (the before/after table).
    #[arg(long, value_name = "REV")]
    pub before: Option<String>,
}

/// One path's data-plane numbers in one round (NaN: not measured there).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DataSample {
    pub tcp_gbps: f64,
    pub rr_p50_us: f64,
    pub rr_p99_us: f64,
    pub udp_kpps: f64,
    /// TCP round trip p50 through a kube-proxy ClusterIP (bridge, flatnet).
    pub clusterip_rr_p50_us: f64,
    /// The datapath program's run time per packet during the UDP flood,
    /// from the kernel's BPF statistics (flatnet, flatnet-xdp).
    pub program_ns: f64,
    /// The same during the TCP stream (packets of up to 64 KiB: GSO).
    pub program_tcp_ns: f64,
    /// The same during ClusterIP round trips (the path's own network).
    pub clusterip_program_ns: f64,
    /// What BPF statistics charge a program that does nothing, in the same
    /// UDP flood: `pod_xdp_pass` on the receiving pod's veth (flatnet-xdp).
    pub program_floor_ns: f64,
}

/// `kernel.bpf_stats_enabled`: the kernel times every BPF program run
/// while it is 1 (a few ns per run, on every path alike).
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Where flatnet pins a network's objects unless told otherwise.
const PIN_ROOT: &str = "/sys/fs/bpf/flatnet";

/// The pin of the program in `dir` (a network's pin directory) whose
/// name starts with `program-`: how bpftool finds it.
fn program_pin(dir: &Path, program: &str) -> Option<Vec<String>> {
    let pin = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(program)
                    .is_some_and(|rest| rest.starts_with('-'))
            })
        })?;
    Some(vec!["pinned".into(), pin.display().to_string()])
}

/// (run time in ns, runs) of the program bpftool finds by `selector`
/// (`pinned PATH`, `id N`), while BPF statistics are on.
fn program_stats(selector: &[String]) -> Option<(u64, u64)> {
    let shown = flatnet_harness::bpftool(
        Command::new("bpftool")
            .args(["prog", "show"])
            .args(selector)
            .arg("-j"),
    )
    .ok()?;
    let json: serde_json::Value = serde_json::from_str(&shown).ok()?;
    // bpftool leaves both out while they are still zero.
    Some((
        json["run_time_ns"].as_u64().unwrap_or(0),
        json["run_cnt"].as_u64().unwrap_or(0),
    ))
}

/// Runs `measure` on `label`'s path with the kernel's BPF statistics on
/// (only then: they cost every BPF program a clock read or two per run),
/// and returns its result with the path's program time per packet and
/// that of the path's do-nothing program (NaN for paths without one).
fn with_program_cost<T>(
    label: &str,
    measure: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, f64, f64)> {
    let Some((network, program)) = measured_program(label) else {
        return Ok((measure()?, f64::NAN, f64::NAN));
    };
    let dir = Path::new(PIN_ROOT).join(network);
    // XDP mode's receiving veth runs `pod_xdp_pass`, which only returns.
    let floor = if label == "flatnet-xdp" {
        "pod_xdp_pass"
    } else {
        program
    };
    let (outcome, [cost, floor_cost]) = with_pinned_program_costs(&dir, [program, floor], measure)?;
    let floor_cost = if floor == program {
        f64::NAN
    } else {
        floor_cost
    };
    Ok((outcome, cost, floor_cost))
}

/// `with_program_cost` for `program` pinned in the pin directory `dir`.
fn with_pinned_program_cost<T>(
    dir: &Path,
    program: &str,
    measure: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, f64)> {
    let (outcome, [cost]) = with_pinned_program_costs(dir, [program], measure)?;
    Ok((outcome, cost))
}

/// The time per run of each of `programs` (pinned in `dir`) while
/// `measure` runs.
fn with_pinned_program_costs<T, const N: usize>(
    dir: &Path,
    programs: [&str; N],
    measure: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, [f64; N])> {
    with_program_costs(programs.map(|program| program_pin(dir, program)), measure)
}

/// The time per run of each program bpftool finds by the `selectors`
/// (None: no such program, NaN) while `measure` runs.
fn with_program_costs<T, const N: usize>(
    selectors: [Option<Vec<String>>; N],
    measure: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, [f64; N])> {
    let stats = || {
        selectors
            .each_ref()
            .map(|selector| selector.as_deref().and_then(program_stats))
    };
    std::fs::write(BPF_STATS, "1").context("turning BPF statistics on")?;
    let before = stats();
    let outcome = measure();
    let after = stats();
    std::fs::write(BPF_STATS, "0").context("turning BPF statistics off")?;
    let mut costs = [f64::NAN; N];
    for (cost, (before, after)) in costs.iter_mut().zip(before.iter().zip(after.iter())) {
        if let (Some((ns0, n0)), Some((ns1, n1))) = (before, after)
            && n1 > n0
        {
            *cost = (ns1 - ns0) as f64 / (n1 - n0) as f64;
        }
    }
    Ok((outcome?, costs))
}

/// The network and datapath program of a path whose program cost is measured.
fn measured_program(label: &str) -> Option<(&'static str, &'static str)> {
    match label {
        "flatnet" => Some(("fb-flatnet", "from_pod")),
        "flatnet-xdp" => Some(("fb-flatnet-xdp", "from_pod_xdp")),
        policy::LABEL => Some((policy::NETWORK, "from_pod")),
        before::LABEL => Some((before::NETWORK, "from_pod")),
        _ => None,
    }
}

/// Everything measured in one round.
#[derive(Debug, Default)]
pub struct Round {
    pub data: BTreeMap<&'static str, DataSample>,
    pub cni: BTreeMap<&'static str, CniTimes>,
    /// The flatnet pair's program variants (`variants`), by name.
    pub variants: BTreeMap<String, variants::VariantSample>,
}

/// Concurrent ADDs of the IPAM-alone comparison: the 64-way, fewer
/// in a smoke run.
pub fn ipam_concurrent(concurrent: usize) -> usize {
    (concurrent * 2).min(64)
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

/// Fails when anything of the bench's flatnet networks (all named `fb-*`)
/// outlived their last pod's DEL: pins, or state under /run/flatnet (locks,
/// slot records, the policy fixture's names file).
fn nothing_left() -> anyhow::Result<()> {
    let mut left = Vec::new();
    for dir in ["/sys/fs/bpf/flatnet", "/run/flatnet"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("fb-") || name.contains("-fb-") {
                left.push(format!("{dir}/{name}"));
            }
        }
    }
    anyhow::ensure!(
        left.is_empty(),
        "the bench's networks left these behind: {left:?}"
    );
    Ok(())
}

/// Network, gateway device and subnet for one plugin configuration.
fn conf(
    kind: &str,
    name: &str,
    device: &str,
    prefix: &str,
    ipam: &str,
    data_dir: &std::path::Path,
) -> String {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": name,
        "type": kind,
        "bridge": device,
        "ipam": {"type": ipam, "subnet": format!("{prefix}.0/24"), "dataDir": data_dir.join(name)},
    });
    if kind == "bridge" {
        // The reference plugin's usual configuration.
        conf["isGateway"] = json!(true);
    }
    conf.to_string()
}

/// flatnet's `bigTcp` default: the GSO/GRO size of the tuned veth pair.
const BIG_TCP: u32 = 524_280;

/// What the bench builds: the plugins, and the agent the overlay
/// section's nodes run.
const BENCH_BINARIES: [&str; 3] = [
    crate::install::BINARIES[0],
    crate::install::BINARIES[1],
    util::AGENT_PACKAGE,
];

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if args.program_cost {
        return program_cost_only(args.out.as_deref());
    }
    if args.overlay {
        return overlay_only(args);
    }
    if args.services {
        return services_only(args);
    }
    let _forwarding = util::SavedForwarding::now();
    let (rounds, seconds, sequential, concurrent) = if args.smoke {
        (1, 1, 5, 4)
    } else {
        (
            args.rounds.max(1),
            args.seconds.max(1),
            args.sequential.max(1),
            args.concurrent.max(1),
        )
    };
    // A smoke run proves the harness on the debug build the suite has just
    // tested (its numbers mean nothing, and CI is spared a release build);
    // a real run measures the release build users deploy.
    let release = !args.smoke;
    // The agent too: the overlay section's simulated nodes run it.
    util::build(release, &BENCH_BINARIES)?;
    let policy_fixture = policy::build_fixture()?;
    let variant_fixture = variants::build_fixture()?;
    let bin = util::binary(release, "flatnet")?
        .parent()
        .map(PathBuf::from)
        .context("the built plugin has no parent directory")?;
    let flatnet_ipam = "flatnet-ipam";
    let cni_path = format!("{}:{REFERENCE_PLUGINS}", bin.display());
    let data_dir = std::env::temp_dir().join(format!("flatnet-bench-{}", std::process::id()));
    let bpf_stats = std::fs::read_to_string(BPF_STATS).unwrap_or_default();
    std::fs::write(BPF_STATS, "0").context("turning BPF statistics off")?;
    let bridge_plugin = |conf: String| {
        Plugin::new(
            PathBuf::from(REFERENCE_PLUGINS).join("bridge"),
            &cni_path,
            conf,
        )
    };
    let flatnet_plugin = |conf: String| Plugin::new(bin.join("flatnet"), &cni_path, conf);
    let before = args.before.as_deref().map(before::build).transpose()?;
    // The earlier build's plugin, with its own flatnet-ipam.
    let before_plugin = |conf: String| {
        before.as_ref().map(|b| {
            let cni_path = format!("{}:{REFERENCE_PLUGINS}", b.bin.display());
            Plugin::new(b.bin.join("flatnet"), &cni_path, conf)
        })
    };

    heading(&format!(
        "bench: {rounds} round(s), {seconds} s per measurement, {sequential} sequential + {concurrent} concurrent pods; flatnet IPAM: {flatnet_ipam}"
    ));
    let outcome = (|| -> anyhow::Result<Vec<Round>> {
        let mut pairs = vec![
            paths::Pair::attached(
                "bridge",
                bridge_plugin(conf(
                    "bridge",
                    "fb-bridge",
                    "fbbr0",
                    "10.211.0",
                    "host-local",
                    &data_dir,
                )),
            )?,
            paths::Pair::attached(
                "flatnet",
                flatnet_plugin(conf(
                    "flatnet",
                    "fb-flatnet",
                    "fbfl0",
                    "10.212.0",
                    flatnet_ipam,
                    &data_dir,
                )),
            )?,
            paths::Pair::attached(
                "flatnet-xdp",
                flatnet_plugin(
                    conf(
                        "flatnet",
                        "fb-flatnet-xdp",
                        "fbflx0",
                        "10.216.0",
                        flatnet_ipam,
                        &data_dir,
                    )
                    .replace(
                        "\"type\":\"flatnet\"",
                        "\"type\":\"flatnet\",\"datapath\":\"xdp\"",
                    ),
                ),
            )?,
            {
                let pair = paths::Pair::attached(
                    policy::LABEL,
                    flatnet_plugin(conf(
                        "flatnet",
                        policy::NETWORK,
                        "fbflp0",
                        "10.218.0",
                        flatnet_ipam,
                        &data_dir,
                    )),
                )?;
                let summary =
                    policy::apply(&policy_fixture, policy::NETWORK, &pair.ip_a, &pair.ip_b)?;
                println!("NetworkPolicy pair: {summary}");
                pair
            },
            paths::Pair::bare_veth("veth", "10.213.0", None)?,
            paths::Pair::bare_veth("veth-big", "10.217.0", Some(BIG_TCP))?,
        ];
        let flatnet_conf = |network: &str, device: &str, prefix: &str| {
            conf("flatnet", network, device, prefix, flatnet_ipam, &data_dir)
        };
        if let Some(plugin) = before_plugin(flatnet_conf(before::NETWORK, "fbflb0", "10.221.0")) {
            pairs.push(paths::Pair::attached(before::LABEL, plugin)?);
        }
        let mut service_plugins = vec![
            (
                "bridge",
                bridge_plugin(conf(
                    "bridge",
                    "fb-svc-bridge",
                    "fbsvbr0",
                    "10.219.0",
                    "host-local",
                    &data_dir,
                )),
                "10.96.0.10".parse()?,
            ),
            (
                "flatnet",
                flatnet_plugin(conf(
                    "flatnet",
                    before::SERVICE_NETWORK,
                    "fbsvfl0",
                    "10.220.0",
                    flatnet_ipam,
                    &data_dir,
                )),
                "10.96.0.11".parse()?,
            ),
        ];
        if let Some(plugin) = before_plugin(flatnet_conf(
            before::SERVICE_NETWORK_BEFORE,
            "fbsvfb0",
            "10.223.0",
        )) {
            service_plugins.push((before::LABEL, plugin, "10.96.0.12".parse()?));
        }
        let service_paths = services::ServicePaths::new(service_plugins)?;
        let cp_bridge = bridge_plugin(conf(
            "bridge",
            "fb-cp-bridge",
            "fbcpbr0",
            "10.214.0",
            "host-local",
            &data_dir,
        ));
        let cp_flatnet = flatnet_plugin(conf(
            "flatnet",
            "fb-cp-flatnet",
            "fbcpfl0",
            "10.215.0",
            flatnet_ipam,
            &data_dir,
        ));
        let mut results = Vec::new();
        for round in 1..=rounds {
            let mut sample = Round::default();
            // Latency in short slices taken in turn (see pingpong.rs), medians per path.
            let slices = (seconds as usize * 3).max(3);
            let mut latency: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
            let mut clusterip: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            let slice = std::time::Duration::from_millis(300);
            for _ in 0..slices {
                for pair in &pairs {
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
            // The program's cost on ClusterIP traffic, in one slice of its
            // own per flatnet build (BPF statistics off for the others).
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
            for pair in &pairs {
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
                sample.data.insert(pair.label, data);
            }
            // The program's parts: its variants on the plain flatnet pair.
            let flatnet_pair = pairs
                .iter()
                .find(|pair| pair.label == "flatnet")
                .context("the flatnet pair")?;
            println!("round {round} flatnet's program variants:");
            sample.variants = variants::measure(
                &variant_fixture,
                flatnet_pair,
                measured_program("flatnet").context("flatnet's network")?.0,
                seconds,
                round,
            )?;
            // IPAM plugins alone, right after the data plane (no namespace
            // teardown still running in the kernel), one after the other.
            // flatnet-ipam also without fsync: on this VM a flush costs 0.1 to
            // 1 ms, so the report shows what the default (flushed) costs.
            let mut ipam_times = BTreeMap::new();
            for (label, plugin) in [
                ("bridge", &cp_bridge),
                ("flatnet", &cp_flatnet),
                ("flatnet-nofsync", &cp_flatnet),
            ] {
                let ipam = if label == "bridge" {
                    "host-local"
                } else {
                    flatnet_ipam
                };
                let ipam_dir = data_dir.join(format!("ipam-{label}"));
                let ipam_plugin = Plugin::new(
                    if ipam == "host-local" {
                        PathBuf::from(REFERENCE_PLUGINS).join(ipam)
                    } else {
                        bin.join(ipam)
                    },
                    &cni_path,
                    ipam_only(&plugin.conf, &ipam_dir, label == "flatnet-nofsync"),
                );
                let times = control::measure_ipam(
                    &ipam_plugin,
                    sequential,
                    ipam_concurrent(concurrent),
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
                    ipam_concurrent(concurrent),
                    times.1
                );
                ipam_times.insert(label, times);
            }
            let (nofsync_sequential, nofsync_concurrent) = ipam_times["flatnet-nofsync"];
            sample.cni.insert(
                "flatnet-nofsync",
                CniTimes {
                    ipam_add_sequential: nofsync_sequential,
                    ipam_add_concurrent: nofsync_concurrent,
                    ..CniTimes::default()
                },
            );
            for (label, plugin) in [("bridge", &cp_bridge), ("flatnet", &cp_flatnet)] {
                let mut times = control::measure(label, plugin, sequential, concurrent)?;
                (times.ipam_add_sequential, times.ipam_add_concurrent) = ipam_times[label];
                println!(
                    "round {round} {label:<8} ADD {:5.2} ms  DEL {:5.2} ms  (x{concurrent} at once: ADD {:5.2} ms/pod  DEL {:5.2} ms/pod)",
                    times.add_sequential,
                    times.del_sequential,
                    times.add_concurrent,
                    times.del_concurrent,
                );
                sample.cni.insert(label, times);
            }
            results.push(sample);
        }
        Ok(results)
    })();
    // The reference bridge plugin leaves its bridges; put the node back
    // (forwarding: `run`'s guard).
    for device in ["fbbr0", "fbcpbr0"] {
        let _ = Command::new("ip").args(["link", "del", device]).output();
    }
    let _ = std::fs::write(BPF_STATS, bpf_stats.trim());
    let _ = std::fs::remove_dir_all(&data_dir);
    let results = outcome?;
    nothing_left()?;

    let out_dir = match (&args.out, args.smoke) {
        (Some(dir), _) => dir.clone(),
        (None, true) => std::env::temp_dir().join("flatnet-bench-smoke"),
        (None, false) => util::root().join("results"),
    };
    services_section(&bin, &out_dir, args.smoke, f64::from(seconds))?;
    heading("bench: pods on two nodes over VXLAN, flatnet against flannel's vxlan backend");
    let overlay = overlay::run(&bin, if args.smoke { 1 } else { rounds }, seconds)?;
    overlay::write(&overlay, &out_dir)?;
    nothing_left()?;
    heading("bench: from_pod's cost per frame kind (BPF_PROG_TEST_RUN, kernel-timed)");
    let cost = program_cost::run(&bin, if args.smoke { 1 } else { 5 })?;
    println!("{}", program_cost::table(&cost));
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(
        out_dir.join("program-cost.json"),
        serde_json::to_string_pretty(&cost)? + "\n",
    )?;
    if !args.smoke {
        heading("bench: RunPodSandbox under containerd's CRI (median of 20 each)");
        let cri = cri::run_pod_sandbox(&bin)?;
        println!("{cri}");
        std::fs::create_dir_all(&out_dir)?;
        std::fs::write(
            out_dir.join("cri.json"),
            serde_json::to_string_pretty(&cri)? + "\n",
        )?;
    }
    let config = report::Config {
        rounds,
        seconds,
        sequential,
        concurrent,
        flatnet_ipam: flatnet_ipam.to_string(),
        before: before.as_ref().map(|b| b.commit.clone()),
    };
    report::write(&results, &config, &out_dir)?;
    // The committed docs follow a full run into results/, never a smoke run
    // or a report written elsewhere.
    if !args.smoke && args.out.is_none() {
        docs::write(&util::root())?;
    }
    Ok(())
}

/// `--program-cost`: the cost table alone, measured on the programs this
/// checkout builds (the test loads them itself; no plugin binary runs).
fn program_cost_only(out: Option<&Path>) -> anyhow::Result<()> {
    heading("bench: from_pod's cost per frame kind (BPF_PROG_TEST_RUN, kernel-timed)");
    let cost = program_cost::run(&util::target_dir(false), 5)?;
    println!("{}", program_cost::table(&cost));
    let out_dir = out.map_or_else(|| util::root().join("results"), Path::to_path_buf);
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(
        out_dir.join("program-cost.json"),
        serde_json::to_string_pretty(&cost)? + "\n",
    )?;
    if out.is_none() {
        docs::write(&util::root())?;
    }
    Ok(())
}

/// `--overlay`: the overlay section alone, on the release build.
/// The Services section (ClusterIPs at the socket, NodePorts from outside,
/// against kube-proxy) with the plugins of `bin`, into `out_dir`.
fn services_section(bin: &Path, out_dir: &Path, smoke: bool, seconds: f64) -> anyhow::Result<()> {
    heading(
        "bench: Services (ClusterIP at the socket, NodePort from outside) against kube-proxy's rules",
    );
    let (service_seconds, service_counts): (f64, &[usize]) = if smoke {
        (0.3, &[10, 100])
    } else {
        (seconds, &[10, 1_000, 10_000])
    };
    let services = socket_services::run(bin, service_seconds, service_counts)?;
    let services_table = socket_services::table(&services);
    println!("{services_table}");
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(
        out_dir.join("services.json"),
        serde_json::to_string_pretty(&services)? + "\n",
    )?;
    std::fs::write(out_dir.join("services.md"), &services_table)?;
    socket_services::chart(&services, &out_dir.join("services.png"))?;
    nothing_left()
}

/// The bench binaries built for release; the plugins' directory.
fn release_plugins() -> anyhow::Result<PathBuf> {
    util::build(true, &BENCH_BINARIES)?;
    util::binary(true, "flatnet")?
        .parent()
        .map(PathBuf::from)
        .context("the built plugin has no parent directory")
}

fn services_only(args: &BenchArgs) -> anyhow::Result<()> {
    let _forwarding = util::SavedForwarding::now();
    let bin = release_plugins()?;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| util::root().join("results"));
    services_section(&bin, &out_dir, false, f64::from(args.seconds.max(1)))?;
    if args.out.is_none() {
        docs::write(&util::root())?;
    }
    Ok(())
}

fn overlay_only(args: &BenchArgs) -> anyhow::Result<()> {
    let _forwarding = util::SavedForwarding::now();
    let bin = release_plugins()?;
    heading("bench: pods on two nodes over VXLAN, flatnet against flannel's vxlan backend");
    let overlay = overlay::run(&bin, args.rounds.max(1), args.seconds.max(1))?;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| util::root().join("results"));
    overlay::write(&overlay, &out_dir)?;
    nothing_left()?;
    if args.out.is_none() {
        docs::write(&util::root())?;
    }
    Ok(())
}

//! `cargo xtask bench`: flatnet against the reference bridge plugin and a
//! bare veth pair. The paths are interleaved round by round in one run and
//! reported as median ratios (the noise of a shared 2-core machine cancels
//! in them).

mod before;
pub(crate) mod chart;
mod control;
mod cri;
pub mod docs;
mod figures;
mod gso;
mod overlay;
mod page;
mod path_setup;
mod paths;
mod pingpong;
mod policy;
mod program_cost;
mod program_stats;
pub mod report;
mod results;
mod rounds;
mod rows;
mod samples;
mod services;
mod socket_services;
mod variants;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::install::REFERENCE_PLUGINS;
use crate::util::{self, heading};
use path_setup::Plugins;
use program_stats::BPF_STATS;
use rounds::Sizes;

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
        "the bench's networks left these behind: {left:?}\n{}",
        why_left(&left)
    );
    Ok(())
}

/// What a leftover network still holds, for the error: the pods its
/// `HOST_VETHS` map names (each host veth's ifindex, and whether that
/// device still exists) and the markers beside it. A network is kept when
/// its last DEL finds a pod still recorded or an agent's marker.
fn why_left(left: &[String]) -> String {
    let mut lines = Vec::new();
    for dir in left.iter().filter(|d| d.starts_with("/sys/fs/bpf/")) {
        let dump = Command::new("bpftool")
            .args(["-j", "map", "dump", "pinned", &format!("{dir}/HOST_VETHS")])
            .output();
        let text = match dump {
            Ok(out) => {
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr)
            }
            Err(e) => format!("bpftool: {e}"),
        };
        lines.push(format!("{dir}/HOST_VETHS: {}", text.trim()));
    }
    let links = Command::new("ip").args(["-o", "link", "show"]).output();
    if let Ok(out) = links {
        let text = String::from_utf8_lossy(&out.stdout);
        let host_veths: Vec<&str> = text.lines().filter(|l| l.contains(": fl")).collect();
        lines.push(format!("host links: {host_veths:#?}"));
    }
    if let Ok(entries) = std::fs::read_dir("/run/flatnet") {
        let names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        lines.push(format!("/run/flatnet: {names:?}"));
    }
    lines.join("\n")
}

/// What the bench builds: the plugins, and the agent the overlay
/// section's nodes run.
pub const BENCH_BINARIES: [&str; 3] = [
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
    let sizes = sizes(args);
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
    let data_dir = std::env::temp_dir().join(format!("flatnet-bench-{}", std::process::id()));
    let bpf_stats = std::fs::read_to_string(BPF_STATS).unwrap_or_default();
    std::fs::write(BPF_STATS, "0").context("turning BPF statistics off")?;
    let before = args.before.as_deref().map(before::build).transpose()?;
    let plugins = Plugins {
        bin: &bin,
        cni_path: format!("{}:{REFERENCE_PLUGINS}", bin.display()),
        before: before.as_ref(),
        data_dir: &data_dir,
        flatnet_ipam,
    };

    heading(&format!(
        "bench: {} round(s), {} s per measurement, {} sequential + {} concurrent pods; flatnet IPAM: {flatnet_ipam}",
        sizes.rounds, sizes.seconds, sizes.sequential, sizes.concurrent
    ));
    let outcome = rounds::measure_rounds(&plugins, &sizes, &policy_fixture, &variant_fixture);
    put_the_node_back(&bpf_stats, &data_dir);
    let results = outcome?;
    nothing_left()?;

    let out_dir = match (&args.out, args.smoke) {
        (Some(dir), _) => dir.clone(),
        (None, true) => std::env::temp_dir().join("flatnet-bench-smoke"),
        (None, false) => util::root().join("results"),
    };
    services_section(&bin, &out_dir, args.smoke, f64::from(sizes.seconds))?;
    overlay_section(&bin, &out_dir, args.smoke, &sizes)?;
    program_cost_section(&bin, &out_dir, args.smoke)?;
    if !args.smoke {
        cri_section(&bin, &out_dir)?;
    }
    let config = rows::Config {
        rounds: sizes.rounds,
        seconds: sizes.seconds,
        sequential: sizes.sequential,
        concurrent: sizes.concurrent,
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

/// Rounds, seconds per measurement, sequential and concurrent pods: a
/// smoke run's few, else `args`' (at least one each).
fn sizes(args: &BenchArgs) -> Sizes {
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
    Sizes {
        rounds,
        seconds,
        sequential,
        concurrent,
    }
}

/// After the rounds, failed or not: the reference bridge plugin leaves its
/// bridges; put the node back (forwarding: `run`'s guard), BPF statistics
/// as they were, and the IPAM state gone.
fn put_the_node_back(bpf_stats: &str, data_dir: &Path) {
    for device in ["fbbr0", "fbcpbr0"] {
        let _ = Command::new("ip").args(["link", "del", device]).output();
    }
    let _ = std::fs::write(BPF_STATS, bpf_stats.trim());
    let _ = std::fs::remove_dir_all(data_dir);
}

/// Pods on two nodes over VXLAN, flatnet against flannel's vxlan backend.
fn overlay_section(bin: &Path, out_dir: &Path, smoke: bool, sizes: &Sizes) -> anyhow::Result<()> {
    heading("bench: pods on two nodes over VXLAN, flatnet against flannel's vxlan backend");
    let overlay = overlay::run(bin, if smoke { 1 } else { sizes.rounds }, sizes.seconds)?;
    overlay::write(&overlay, out_dir)?;
    nothing_left()
}

/// from_pod's cost per frame kind, into program-cost.json.
fn program_cost_section(bin: &Path, out_dir: &Path, smoke: bool) -> anyhow::Result<()> {
    heading("bench: from_pod's cost per frame kind (BPF_PROG_TEST_RUN, kernel-timed)");
    let cost = program_cost::run(bin, if smoke { 1 } else { 5 })?;
    println!("{}", program_cost::table(&cost));
    write_json(out_dir, "program-cost.json", &cost)?;
    Ok(())
}

/// RunPodSandbox under containerd's CRI, into cri.json.
fn cri_section(bin: &Path, out_dir: &Path) -> anyhow::Result<()> {
    heading("bench: RunPodSandbox under containerd's CRI (median of 20 each)");
    let cri = cri::run_pod_sandbox(bin)?;
    println!("{cri}");
    write_json(out_dir, "cri.json", &cri)?;
    Ok(())
}

/// `--program-cost`: the cost table alone, measured on the programs this
/// checkout builds (the test loads them itself; no plugin binary runs).
fn program_cost_only(out: Option<&Path>) -> anyhow::Result<()> {
    heading("bench: from_pod's cost per frame kind (BPF_PROG_TEST_RUN, kernel-timed)");
    let cost = program_cost::run(&util::target_dir(false), 5)?;
    println!("{}", program_cost::table(&cost));
    let out_dir = out.map_or_else(|| util::root().join("results"), Path::to_path_buf);
    write_json(&out_dir, "program-cost.json", &cost)?;
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
    write_json(out_dir, "services.json", &services)?;
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

/// Writes `value` as pretty JSON to `file` in `out_dir`, made if missing.
fn write_json(out_dir: &Path, file: &str, value: &impl serde::Serialize) -> anyhow::Result<()> {
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(
        out_dir.join(file),
        serde_json::to_string_pretty(value)? + "\n",
    )?;
    Ok(())
}

//! The benchmark's report: medians and median ratios against the targets,
//! as a terminal table, a markdown file, raw JSON and a PNG chart, written
//! with the run's date, commit and machine.

use std::path::Path;
use std::process::Command;

use super::chart::chart;
use super::rows::{Config, policy_table, rows, table};
use super::samples::Round;
use crate::util::{self, heading};

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

/// The time now, as the reports give it (`2026-11-30 17:21 UTC`).
pub fn now_utc() -> String {
    Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// HEAD's short hash, and whether the tree has uncommitted changes.
pub fn commit() -> String {
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

pub fn write(results: &[Round], config: &Config, dir: &Path) -> anyhow::Result<()> {
    let rows = rows(results, config);
    let table = table(&rows);
    let when = now_utc();
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

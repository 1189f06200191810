//! `--before REV`: flatnet as an earlier commit built it, measured in the
//! same rounds as this checkout's build. A plain pair and a ClusterIP path
//! of each are measured, so a change to the datapath is judged by
//! before/after ratios taken minutes apart on the same machine, not by
//! numbers from runs days apart. The 100-policy pair is this build's only:
//! its policies are written by the tests crate's fixture, which writes this
//! build's maps (an earlier build's pins are not this build's to write).
//!
//! The earlier commit's sources are exported (`git archive`) under
//! `target/bench-before/<commit>` and built there with a target directory
//! shared by every such export, so a second run builds nothing.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, ensure};

use super::figures::{number, ratio_median, value_median};
use super::samples::{DataSample, Round};
use crate::util::{self, output};

/// The earlier build's plain pair.
pub const LABEL: &str = "flatnet-before";
pub const NETWORK: &str = "fb-flatnet-b";
/// The networks of the two ClusterIP paths, after and before.
pub const SERVICE_NETWORK: &str = "fb-svc-flatnet";
pub const SERVICE_NETWORK_BEFORE: &str = "fb-svc-flatnet-b";

/// An earlier commit's plugin binaries.
pub struct Before {
    /// The commit, abbreviated.
    pub commit: String,
    /// Where its `flatnet` and `flatnet-ipam` are.
    pub bin: PathBuf,
}

/// Exports and builds `rev` (release, as the bench builds this checkout).
pub fn build(rev: &str) -> anyhow::Result<Before> {
    let root = util::root();
    let commit = output(
        Command::new("git")
            .current_dir(&root)
            .args(["rev-parse", "--verify", "--short=12"])
            .arg(format!("{rev}^{{commit}}")),
    )
    .with_context(|| format!("--before {rev}: not a commit of this repository"))?
    .trim()
    .to_string();
    let base = root.join("target").join("bench-before");
    let src = base.join(&commit);
    if !src.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&src)?;
        let archive = Command::new("git")
            .current_dir(&root)
            .args(["archive", "--format=tar", &commit])
            .stdout(Stdio::piped())
            .spawn()
            .context("git archive")?;
        let unpacked = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&src)
            .stdin(archive.stdout.context("git archive's output")?)
            .status()
            .context("tar")?;
        ensure!(
            unpacked.success(),
            "unpacking {commit} into {}",
            src.display()
        );
    }
    let target = base.join("target");
    util::heading(&format!("build of {commit} (--before), release"));
    // `cargo()` puts this checkout's bpf-linker on PATH; the export has no
    // .tools of its own.
    let mut cargo = util::cargo();
    cargo
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        .args(["build", "--release"]);
    for package in ["flatnet", "flatnet-ipam"] {
        cargo.args(["--package", package, "--bin", package]);
    }
    util::run_cmd(&mut cargo)?;
    Ok(Before {
        commit,
        bin: target.join("release"),
    })
}

/// A data-plane metric of the before/after table: name, how it is read,
/// which paths (after, before), and whether smaller is better.
type Metric = (&'static str, fn(&DataSample) -> f64, [&'static str; 2]);

/// This build against the earlier one, same rounds: medians over rounds
/// and the median of the per-round ratios after/before; "-" where a run
/// had no `--before`.
pub fn table(results: &[Round]) -> String {
    let plain = ["flatnet", LABEL];
    let metrics: [Metric; 7] = [
        ("UDP 64 B received (kpps)", |d| d.udp_kpps, plain),
        ("TCP round trip p50 (us)", |d| d.rr_p50_us, plain),
        ("TCP throughput (Gbit/s)", |d| d.tcp_gbps, plain),
        ("program ns/packet, 64 B UDP", |d| d.program_ns, plain),
        ("program ns/packet, TCP stream", |d| d.program_tcp_ns, plain),
        (
            "ClusterIP (kube-proxy iptables) round trip p50 (us)",
            |d| d.clusterip_rr_p50_us,
            plain,
        ),
        (
            "ClusterIP: program ns/packet",
            |d| d.clusterip_program_ns,
            plain,
        ),
    ];
    let mut out =
        String::from("| metric | after | before | after/before |\n|---|---:|---:|---:|\n");
    for (metric, pick, [after, before]) in metrics {
        let value = move |round: &Round, path: &str| round.data.get(path).map(pick);
        let ratio = ratio_median(results, value, after, before);
        let _ = writeln!(
            out,
            "| {metric} | {} | {} | {} |",
            number(value_median(results, &value, after)),
            number(value_median(results, &value, before)),
            ratio.map(number).unwrap_or_else(|| "-".into()),
        );
    }
    let floor = |round: &Round, path: &str| round.data.get(path).map(|d| d.program_floor_ns);
    let _ = writeln!(
        out,
        "| BPF statistics' floor: a program that only returns (`pod_xdp_pass`, flatnet-xdp pair), ns/packet in the UDP flood | {} | - | - |",
        number(value_median(results, &floor, "flatnet-xdp")),
    );
    out
}

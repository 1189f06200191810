//! What a datapath program costs while a measurement runs: the kernel's
//! BPF statistics turned on around it, read through bpftool before and
//! after, per program pinned in a network's pin directory.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::{before, policy};

/// `kernel.bpf_stats_enabled`: the kernel times every BPF program run
/// while it is 1 (a few ns per run, on every path alike).
pub(super) const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

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
pub(super) fn with_program_cost<T>(
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
pub(super) fn with_pinned_program_cost<T>(
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
pub(super) fn with_program_costs<T, const N: usize>(
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
pub(super) fn measured_program(label: &str) -> Option<(&'static str, &'static str)> {
    match label {
        "flatnet" => Some(("fb-flatnet", "from_pod")),
        "flatnet-xdp" => Some(("fb-flatnet-xdp", "from_pod_xdp")),
        policy::LABEL => Some((policy::NETWORK, "from_pod")),
        before::LABEL => Some((before::NETWORK, "from_pod")),
        _ => None,
    }
}

//! Real-Kubernetes cluster tests: what they need on the machine, prepared
//! once and cached outside the checkout (`build/`; docs/kubernetes.md,
//! Real Kubernetes), and `cargo xtask e2e`, which brings up a
//! cluster of real components on this machine with flatnet as its CNI and
//! runs the upstream e2e suites of the same release on it.

mod args;
pub mod build;
mod cgroups;
mod cluster;
mod control_plane;
pub mod critest;
mod daemon;
mod first_packet;
mod guard;
mod host;
pub mod images;
mod node;
mod pki;
mod plan;
mod runtime_status;
mod suites;
mod sysctls;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};

pub use args::E2eArgs;
pub use cluster::ServicesMode;

use crate::util::{self, heading};

/// Where a run's logs and reports go (kept), per Services mode.
fn logs_root() -> PathBuf {
    util::root().join("target/e2e")
}

/// Where the clusters' state goes (removed after each).
pub const STATE_DIR: &str = "/var/tmp/flatnet-e2e";

/// `results/e2e.md` written again from the `results/e2e-<mode>.json` it
/// is made of (after a change to how it is written; no cluster needed).
pub fn write_summary(results: &std::path::Path) -> anyhow::Result<()> {
    suites::write_results(&[], results, "")?;
    println!("wrote {}", results.join("e2e.md").display());
    Ok(())
}

pub fn run(args: &E2eArgs) -> anyhow::Result<()> {
    if !util::is_root() {
        bail!("cargo xtask e2e runs a cluster of real kubelets: run it as root");
    }
    let started = Instant::now();
    // One cluster at a time on a machine: the names are fixed.
    std::fs::create_dir_all(STATE_DIR)?;
    let lock_file = std::fs::File::create(PathBuf::from(STATE_DIR).join(".lock"))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock)
        .map_err(|_| anyhow::anyhow!("another `cargo xtask e2e` is running on this machine"))?;
    if args.clean_up {
        undo_interrupted_run();
        println!("e2e: nothing of an earlier run is left on this machine");
        return Ok(());
    }
    // What is deployed is built from the tree as it is now: the results
    // name this commit, not the one at the end of a long run.
    let commit = util::output(std::process::Command::new("git").args([
        "-C",
        &util::root().display().to_string(),
        "describe",
        "--always",
        "--dirty",
    ]))
    .unwrap_or_default()
    .trim()
    .to_string();
    let built = build::prepare(&args.kubernetes)?;
    clean_up_leftovers();
    tear_down_on_signal()?;

    // The agent's image carries the release binaries, as a user builds it
    // (or the debug ones, with --debug-build).
    let release = !args.debug_build;
    util::build(release, &[])?;
    // The debug build has the cluster DNS already (a workspace crate).
    if release {
        util::run_cmd(util::cargo().args([
            "build",
            "--release",
            "--package",
            "flatnet-cluster-dns",
        ]))?;
    }
    heading("e2e: images");
    let images = images::for_cluster(&built, release)?;

    heading("e2e: the uplink guard");
    guard::self_test().context("the uplink guard's self-test")?;
    let guard = guard::Guard::install(None)?;
    let sysctls = sysctls::SavedSysctls::save(&PathBuf::from(STATE_DIR).join("sysctls.json"))?;
    let _forwarding = util::SavedForwarding::now();

    let modes = if args.services.is_empty() {
        ServicesMode::ALL.to_vec()
    } else {
        args.services.clone()
    };
    let mut outcome = Ok(());
    let mut reports = Vec::new();
    for mode in modes {
        heading(&format!("e2e: a cluster with {} Services", mode.name()));
        let result = run_mode(args, mode, &built, &images);
        let dropped = guard.dropped()?;
        // The cluster is down: nothing of it may stay (a process kept in a
        // machine's cgroup keeps the cgroup, and the next cluster reuses it
        // with whatever is attached to it).
        let mut left = cgroups::leftovers();
        let shims = machine_shims();
        if !shims.is_empty() {
            left.push(format!("containerd shims {shims:?}"));
        }
        if !left.is_empty() {
            bail!(
                "the {} cluster left on this machine: {}",
                mode.name(),
                left.join("; ")
            );
        }
        match result {
            Ok(report) => reports.push(report),
            Err(e) => {
                outcome = Err(e);
            }
        }
        if dropped != 0 {
            bail!(
                "the uplink guard dropped {dropped} packet(s) of the cluster's ranges: something of the cluster tried to leave the machine"
            );
        }
        let changed = sysctls.restore();
        if !changed.is_empty() {
            println!(
                "e2e: put back what the cluster changed: {}",
                changed.join(", ")
            );
        }
        sysctls.verify()?;
        if outcome.is_err() {
            break;
        }
    }
    sysctls.done();
    suites::print_summary(&reports);
    if args.full && args.focus.is_none() {
        let header = format!(
            "{} UTC, commit {}, flatnet's {} build; Kubernetes {} (e2e.test and ginkgo from the same module), {} nodes, containerd {}; `cargo xtask e2e --full`",
            util::output(std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M"]))
                .unwrap_or_default()
                .trim(),
            commit,
            if args.debug_build { "debug" } else { "release" },
            built.release.tag(),
            args.nodes,
            build::CONTAINERD_VERSION,
        );
        suites::write_results(&reports, &results_dir(&args.kubernetes)?, &header)?;
    }
    println!(
        "e2e: the uplink guard dropped 0 packets; global settings restored; {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    outcome?;
    suites::verdict(&reports)
}

/// Where a full run's results go: results/ for the release the project
/// is tested on, results/e2e-v<release>/ (its own e2e.md beside the
/// reports) for the older ones of the `--full` matrix.
fn results_dir(release: &build::Release) -> anyhow::Result<PathBuf> {
    let results = util::root().join("results");
    Ok(if *release == build::DEFAULT_RELEASE.parse()? {
        results
    } else {
        results.join(format!("e2e-{}", release.tag()))
    })
}

fn run_mode(
    args: &E2eArgs,
    mode: ServicesMode,
    built: &build::Built,
    images: &[PathBuf],
) -> anyhow::Result<suites::ModeReport> {
    let name = mode.run_name(args.dual_stack);
    let logs = logs_root().join(&name);
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let plan = plan::Plan {
        dir: PathBuf::from(STATE_DIR).join(&name),
        logs: logs.clone(),
        nodes: args.nodes,
        dual_stack: args.dual_stack,
    };
    let mut cluster = cluster::Cluster::up(plan, mode, built, images)?;
    let report = suites::run(&mut cluster, args, built)?;
    if args.keep {
        println!(
            "e2e: the cluster is kept running: kubectl --kubeconfig {} (enter with nsenter --target {} --mount --uts --net); press Enter to tear it down",
            cluster.control_plane.admin_kubeconfig.display(),
            cluster.control_plane.host.pid()
        );
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    cluster.down();
    Ok(report)
}

/// On SIGINT, SIGTERM or SIGHUP (Ctrl-C, CI's timeout): everything a
/// cluster made is found by its names and taken away, the guard removed,
/// the saved settings put back, and the process exits. Without it a killed
/// run would leave its machines until the next run.
fn tear_down_on_signal() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            eprintln!("\ne2e: signal {signal}: tearing the cluster down");
            undo_interrupted_run();
            std::process::exit(128 + signal);
        }
    });
    Ok(())
}

/// What a killed run left (its machines, guard and sysctls), taken back
/// unless a run is going on now (it holds the lock).
pub fn undo_killed_run() {
    let Ok(lock_file) = std::fs::File::create(PathBuf::from(STATE_DIR).join(".lock")) else {
        return;
    };
    if let Ok(_lock) = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock) {
        undo_interrupted_run();
    }
}

/// Everything a run changes on the machine, taken back: its machines, the
/// uplink guard, and the global sysctls (saved before the first cluster;
/// loading the saved file puts them back).
fn undo_interrupted_run() {
    clean_up_leftovers();
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "inet", guard::TABLE])
        .output();
    let saved = PathBuf::from(STATE_DIR).join("sysctls.json");
    if let Ok(sysctls) = sysctls::SavedSysctls::save(&saved) {
        sysctls.done();
    }
}

/// What a crashed or killed earlier run left: its machines' processes,
/// network namespaces, cgroups, mounts' folders.
fn clean_up_leftovers() {
    for entry in std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(plan::PREFIX) {
            continue;
        }
        println!("e2e: removing {name}, left by an earlier run");
        // Each machine's processes are found by their network namespace's
        // holder: every process whose net namespace is this one, and every
        // process sharing a mount namespace with one of them.
        let Ok(netns) = nix::sys::stat::stat(&entry.path()) else {
            continue;
        };
        let mut mount_namespaces = std::collections::BTreeSet::new();
        for pid in processes() {
            if let Ok(meta) = nix::sys::stat::stat(format!("/proc/{pid}/ns/net").as_str())
                && meta.st_ino == netns.st_ino
                && let Ok(mnt) = std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
            {
                mount_namespaces.insert(mnt);
            }
        }
        let own = std::fs::read_link("/proc/self/ns/mnt").ok();
        for mnt in mount_namespaces {
            if Some(&mnt) != own.as_ref() {
                host::kill_mount_namespace(&mnt);
            }
        }
        // containerd's shims, in mount namespaces of their own.
        host::kill_namespace_members("net", Path::new(&format!("net:[{}]", netns.st_ino)));
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &name])
            .output();
        if let Some(index) = name.strip_prefix(&format!("{}-node-", plan::PREFIX)) {
            cgroups::remove_cgroup_tree(&format!("/{}-node-{index}", plan::PREFIX));
        }
    }
    kill_orphaned_shims();
    // Machines' cgroups a teardown could not remove (something was left
    // in them): what is in them is killed, then they go.
    let roots: std::collections::BTreeSet<String> = cgroups::cgroup_hierarchies()
        .unwrap_or_default()
        .iter()
        .flat_map(|hierarchy| cgroups::machine_cgroups(hierarchy))
        .collect();
    for root in roots {
        println!("e2e: removing the cgroup {root}, left by an earlier run");
        cgroups::remove_cgroup_tree(&root);
    }
    for name in run_names() {
        let dir = PathBuf::from(STATE_DIR).join(name);
        for machine in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            host::remove_made_mount_points(&machine.path());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every run's folder name, dual-stack runs' too: clean-up removes them
/// all, so a machine's containerd store left by a killed run is never
/// reused by the next (its blobs may be half collected).
fn run_names() -> Vec<String> {
    ServicesMode::ALL
        .iter()
        .flat_map(|mode| [mode.run_name(false), mode.run_name(true)])
        .collect()
}

/// containerd shims of machines already gone: a run interrupted while
/// its cluster was coming down (the machine's network namespace deleted
/// before its shims, which live in mount namespaces of their own, were
/// killed) leaves them holding the machine's mounts, its bpffs with the
/// agent's pinned links among them. A machine's shim serves the machine's
/// own containerd socket and is not in this host's network namespace: the
/// host's own runtimes' shims are.
fn kill_orphaned_shims() {
    for pid in machine_shims() {
        println!("e2e: killing containerd shim {pid}, left by an earlier run");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The running containerd shims of this suite's machines.
fn machine_shims() -> Vec<i32> {
    let own_net = std::fs::read_link("/proc/self/ns/net").ok();
    processes()
        .into_iter()
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let machine_shim = args.first().is_some_and(|a| a.contains("containerd-shim"))
                && args
                    .windows(2)
                    .any(|w| w[0] == "-address" && w[1] == node::SOCKET);
            let net = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            machine_shim && net.is_some() && net != own_net
        })
        .collect()
}

fn processes() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{ServicesMode, run_names};

    /// A dual-stack run's folder was once left behind by clean-up, and
    /// the next run imported images into its half-collected store.
    #[test]
    fn clean_up_knows_every_runs_folder() {
        let names = run_names();
        for mode in ServicesMode::ALL {
            for dual_stack in [false, true] {
                assert!(
                    names.contains(&mode.run_name(dual_stack)),
                    "{mode:?} {dual_stack}"
                );
            }
        }
        assert!(names.contains(&"kube-proxy-nftables-dual-stack".to_string()));
    }
}

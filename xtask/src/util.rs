//! Small helpers: the workspace root, running commands loudly, headings.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
pub use flatnet_harness::{is_root, output};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A stage's heading, with the minutes since xtask started (where CI's
/// time goes).
pub fn heading(text: &str) {
    let seconds = started().elapsed().as_secs();
    println!(
        "\n\x1b[1m== {text}\x1b[0m [{}:{:02}]",
        seconds / 60,
        seconds % 60
    );
}

/// When xtask started (its first call).
pub fn started() -> std::time::Instant {
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(std::time::Instant::now)
}

/// Runs a command with inherited output; fails when it fails.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let text = flatnet_harness::describe(cmd);
    println!("$ {text}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{text}`"))?;
    if !status.success() {
        bail!("`{text}` failed with {status}");
    }
    Ok(())
}

/// Runs a bpftool view and prints what it printed; judged by that, not its
/// exit status (see `flatnet_harness::bpftool`).
pub fn run_bpftool(args: &[&str], path: Option<&std::path::Path>) -> anyhow::Result<String> {
    let mut cmd = Command::new("bpftool");
    cmd.args(args);
    if let Some(path) = path {
        cmd.arg(path);
    }
    println!("$ {}", flatnet_harness::describe(&cmd));
    let shown = flatnet_harness::bpftool(&mut cmd)?;
    print!("{shown}");
    Ok(shown)
}

/// The host's forwarding switches, which pods' ADDs turn on.
pub const FORWARDING_SWITCHES: &[&str] = &[
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv6/conf/all/forwarding",
];

/// The host's forwarding switches as they were, put back on drop: the
/// bench's reference bridge and flatnet's ADDs turn them on, and a run of
/// the suite or the bench leaves the node as it found it.
pub struct SavedForwarding(Vec<(&'static str, String)>);

impl SavedForwarding {
    pub fn now() -> Self {
        SavedForwarding(forwarding_now())
    }
}

/// Each forwarding switch and its value now (those that can be read).
pub fn forwarding_now() -> Vec<(&'static str, String)> {
    FORWARDING_SWITCHES
        .iter()
        .copied()
        .filter_map(|path| Some((path, std::fs::read_to_string(path).ok()?)))
        .collect()
}

impl Drop for SavedForwarding {
    fn drop(&mut self) {
        for (path, value) in &self.0 {
            let _ = std::fs::write(path, value.trim());
        }
    }
}

/// The toolchain the eBPF object (and the fuzz targets) are built with:
/// `$FLATNET_EBPF_TOOLCHAIN`, else nightly when rustup has it, else stable
/// with `RUSTC_BOOTSTRAP=1` (plugin/datapath/build.rs chooses the same).
pub fn ebpf_toolchain() -> String {
    if let Ok(chosen) = std::env::var("FLATNET_EBPF_TOOLCHAIN")
        && !chosen.is_empty()
    {
        return chosen;
    }
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "-V"])
        .output()
        .is_ok_and(|out| out.status.success());
    if nightly { "nightly" } else { "stable" }.to_string()
}

/// clippy-driver, once [`lint_while_building`] chose it.
static LINT_DRIVER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// From now on this process's builds run clippy's lints (warnings denied)
/// on the workspace's crates as they compile them: clippy-driver is cargo's
/// workspace wrapper (what `cargo clippy` sets), so the dependencies compile
/// once, where `cargo clippy` and a build compile them twice (once only to
/// check them: 4.5 of a cold suite's minutes on 2 cores). The wrapper is
/// part of the crates' fingerprint: every build of the run sets it, or the
/// workspace's crates would build again.
pub fn lint_while_building() -> anyhow::Result<()> {
    let sysroot = output(Command::new("rustc").args(["--print", "sysroot"]))?;
    let driver = Path::new(sysroot.trim()).join("bin/clippy-driver");
    anyhow::ensure!(
        driver.is_file(),
        "{} is missing: `rustup component add clippy`",
        driver.display()
    );
    let _ = LINT_DRIVER.set(driver);
    Ok(())
}

/// `cargo` with the project-local tools (bpf-linker) on PATH.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    if let Some(driver) = LINT_DRIVER.get() {
        // `cargo clippy -- -D warnings` passes its arguments this way.
        cmd.env("RUSTC_WORKSPACE_WRAPPER", driver).env(
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        );
    }
    let tools = root().join(".tools/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![tools];
    dirs.extend(std::env::split_paths(&path));
    if let Ok(joined) = std::env::join_paths(dirs) {
        cmd.env("PATH", joined);
    }
    // A CI run builds each crate once, from a clean checkout: incremental
    // caches would only take disk (as much again as the build).
    if in_ci() && std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    cmd
}

/// Whether this runs under CI (`CI` set, and not to `false` or `0`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The plugins a runtime executes for every pod; release builds link them
/// statically (see [`build`]).
pub const STATIC_BINARIES: &[&str] = &["flatnet", "flatnet-ipam"];

/// The agent's crate, whose binary has the same name.
pub const AGENT_PACKAGE: &str = "flatnet-agent";

/// Builds the plugin crates' binaries: in release, `only` names some of
/// them (install and bench need the two plugins, not the agent and its
/// Kubernetes stack), empty means all; in debug, everything ([`build_debug`]).
///
/// In release builds the two plugins are linked statically against glibc
/// (`+crt-static`, for the host triple so build scripts stay dynamic): the
/// dynamic loader costs about 0.35 ms per exec on these machines, a third of
/// an IPAM ADD, and a static plugin runs on any node whatever its glibc,
/// which matters when the agent copies it out of its image onto the host.
/// The agent stays dynamic: it resolves host names through NSS.
pub fn build(release: bool, only: &[&str]) -> anyhow::Result<()> {
    heading(&format!(
        "build ({})",
        if release { "release" } else { "debug" }
    ));
    let (static_bins, dynamic_bins): (Vec<&str>, Vec<&str>) = if release {
        let all: Vec<&str> = if only.is_empty() {
            STATIC_BINARIES
                .iter()
                .copied()
                .chain([AGENT_PACKAGE])
                .collect()
        } else {
            only.to_vec()
        };
        all.into_iter()
            .partition(|bin| STATIC_BINARIES.contains(bin))
    } else {
        return build_debug();
    };
    if !static_bins.is_empty() {
        let triple = host_triple()?;
        let mut cmd = cargo();
        cmd.args(["build", "--release", "--target", &triple]).env(
            format!(
                "CARGO_TARGET_{}_RUSTFLAGS",
                triple.to_uppercase().replace('-', "_")
            ),
            "-C target-feature=+crt-static",
        );
        for bin in &static_bins {
            // Each binary is its own package's (plugin/flatnet, plugin/ipam, plugin/agent).
            cmd.args(["--package", bin, "--bin", bin]);
        }
        run_cmd(&mut cmd)?;
    }
    if dynamic_bins.is_empty() {
        return Ok(());
    }
    let mut cmd = cargo();
    cmd.args(["build", "--release"]);
    if dynamic_bins.is_empty() {
        // Every binary: the plugins' crates and the agent's.
        for package in ["flatnet", "flatnet-ipam", AGENT_PACKAGE] {
            cmd.args(["--package", package]);
        }
        cmd.arg("--bins");
    } else {
        for bin in &dynamic_bins {
            cmd.args(["--package", bin, "--bin", bin]);
        }
    }
    run_cmd(&mut cmd)
}

/// The debug build, always the same one: every crate of the workspace
/// with all its targets (tests included), as `cargo test --workspace`
/// builds it. Cargo unifies features over the packages and targets a
/// command selects, so a build of a subset (`-p flatnet --bin flatnet`)
/// would compile the whole dependency graph again with other features,
/// and the datapath's eBPF object with it; one selection builds it once.
pub fn build_debug() -> anyhow::Result<()> {
    run_cmd(cargo().args([
        "build",
        "--workspace",
        "--exclude",
        "flatnet-ebpf",
        "--all-targets",
    ]))
}

/// `cargo test` of the integration suite alone, selecting what
/// [`build_debug`] builds so that it reuses that build (a `-p flatnet-tests`
/// selection would unify features differently and compile the whole graph a
/// second time, doubling the target folder).
pub fn integration_test() -> Command {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--workspace",
        "--exclude",
        "flatnet-ebpf",
        "--test",
        "integration",
    ]);
    cmd
}

/// The triple rustc builds for by default, e.g. `x86_64-unknown-linux-gnu`.
pub fn host_triple() -> anyhow::Result<String> {
    let info = output(Command::new("rustc").arg("-vV"))?;
    info.lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(|triple| triple.trim().to_string())
        .context("`rustc -vV` printed no `host:` line")
}

/// Where a built binary is: release plugins under `target/<triple>/release`
/// (static), everything else under `target/{debug,release}`.
pub fn binary(release: bool, name: &str) -> anyhow::Result<PathBuf> {
    if release && STATIC_BINARIES.contains(&name) {
        Ok(root()
            .join("target")
            .join(host_triple()?)
            .join("release")
            .join(name))
    } else {
        Ok(target_dir(release).join(name))
    }
}

/// A folder of this process's own holding the plugins of `plugin_dir` and
/// the agent of the same build: a simulated node's agent installs the
/// plugins beside itself, and a release build puts the static plugins and
/// the agent in different target folders. The caller removes it.
pub fn plugins_with_agent(plugin_dir: &Path) -> anyhow::Result<PathBuf> {
    let bin_dir = std::env::temp_dir().join(format!("flatnet-bins-{}", std::process::id()));
    std::fs::create_dir_all(&bin_dir)?;
    let agent = binary(plugin_dir.ends_with("release"), AGENT_PACKAGE)?;
    for (name, from) in [
        ("flatnet", plugin_dir.join("flatnet")),
        ("flatnet-ipam", plugin_dir.join("flatnet-ipam")),
        (AGENT_PACKAGE, agent),
    ] {
        std::fs::copy(&from, bin_dir.join(name))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(bin_dir)
}

/// When and from what a measurement was made: the UTC minute and `git
/// describe --always --dirty` (empty when either cannot be had).
pub fn date_and_commit() -> (String, String) {
    let text = |cmd: &mut Command| output(cmd).unwrap_or_default().trim().to_string();
    (
        text(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        text(Command::new("git").args(["describe", "--always", "--dirty"])),
    )
}

pub fn target_dir(release: bool) -> PathBuf {
    root()
        .join("target")
        .join(if release { "release" } else { "debug" })
}

/// Runs a command with `input` on its stdin; its stdout, or an error with
/// its stderr.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> anyhow::Result<String> {
    let text = flatnet_harness::describe(cmd);
    let done = flatnet_harness::run_with_stdin(cmd, input);
    if !done.success() {
        bail!("`{text}` failed ({:?}): {}", done.code, done.stderr.trim());
    }
    Ok(done.stdout)
}

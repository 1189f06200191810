//! Small helpers: the workspace root, running commands loudly, headings.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn heading(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Runs a command with inherited output; fails when it fails.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let text = describe(cmd);
    println!("$ {text}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{text}`"))?;
    if !status.success() {
        bail!("`{text}` failed with {status}");
    }
    Ok(())
}

/// Runs a command and returns its stdout; fails when it fails.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let text = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{text}`"))?;
    if !out.status.success() {
        bail!(
            "`{text}` failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// True when the command runs and succeeds (output discarded).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.output()
        .map(|out| out.status.success())
        .unwrap_or(false)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `cargo` with the project-local tools (bpf-linker) on PATH.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    let tools = root().join(".tools/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![tools];
    dirs.extend(std::env::split_paths(&path));
    if let Ok(joined) = std::env::join_paths(dirs) {
        cmd.env("PATH", joined);
    }
    cmd
}

/// Builds the plugin crate's binaries (debug or release): `only` names
/// some of them (install and bench need the two plugins, not the agent and
/// its Kubernetes stack), empty means all.
pub fn build(release: bool, only: &[&str]) -> anyhow::Result<()> {
    heading(&format!(
        "build ({})",
        if release { "release" } else { "debug" }
    ));
    let mut cmd = cargo();
    cmd.args(["build", "--package", "flatnet"]);
    if only.is_empty() {
        cmd.arg("--bins");
    }
    for bin in only {
        cmd.args(["--bin", bin]);
    }
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)
}

pub fn target_dir(release: bool) -> PathBuf {
    root()
        .join("target")
        .join(if release { "release" } else { "debug" })
}

//! `cargo xtask critest`: cri-tools' CRI validation suite (`critest`)
//! against containerd 2 with flatnet as its CNI, on a machine of its own
//! (`machine.rs`), pulling stand-in images from a registry on that
//! machine's loopback (`registry.rs`, `e2e/images/critest_images.rs`);
//! its results grouped into networking specs and the rest
//! (`report.rs`), written to `results/critest.md`.

mod cleanup;
mod machine;
mod names;
mod registry;
mod report;
mod runtime_cni;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use super::build::{self, Built};
use crate::util::{self, heading};

#[derive(clap::Args, Clone)]
pub struct CritestArgs {
    /// The Kubernetes release whose e2e-build provides containerd, its
    /// shim, crictl, critest and pause.
    #[arg(long, default_value = build::DEFAULT_RELEASE)]
    pub kubernetes: build::Release,
    /// Only the specs matching this regular expression (ginkgo focus);
    /// results/critest.md is then left alone.
    #[arg(long)]
    pub focus: Option<String>,
    /// Take containerd, containerd-shim-runc-v2, crictl, critest and pause
    /// from this folder instead of e2e-build's cache (a build of the same
    /// versions made elsewhere).
    #[arg(long)]
    pub binaries: Option<PathBuf>,
}

/// Where a run's logs and JUnit report go (kept until the next run).
fn logs_root() -> PathBuf {
    util::root().join("target/critest")
}

pub fn run(args: &CritestArgs) -> anyhow::Result<()> {
    if !util::is_root() {
        bail!("cargo xtask critest runs containerd and its sandboxes: run it as root");
    }
    let started = Instant::now();
    let built = build::prepare_binaries(&args.kubernetes, args.binaries.as_deref())?;
    crate::setup::ensure_packages(&["curl", "gcc", "libc6-dev"])?;
    // The plugins as users install them: the static release build.
    util::build(true, crate::install::BINARIES)?;
    let mut plugins: Vec<PathBuf> = crate::install::BINARIES
        .iter()
        .map(|name| util::binary(true, name))
        .collect::<anyhow::Result<_>>()?;
    // The reference plugins of the same build (CNI 1.1: STATUS and GC).
    plugins.extend(["portmap", "loopback"].map(|p| built.bin(build::CNI_PLUGINS_DIR).join(p)));

    heading("critest: images and registry");
    let cache = build::cache_root(&args.kubernetes).join("critest");
    let crane = registry::crane(&cache)?;
    let images = super::images::for_critest(
        &built.bin("pause"),
        &cache.join("nnp"),
        &cache.join("images"),
    )?;

    let logs = logs_root();
    let _ = std::fs::remove_dir_all(&logs);
    let crictl = built.bin("crictl");
    flatnet_harness::remove_on_signal()?;
    let listed = flatnet_harness::made_here(move || cleanup::clean_up(&crictl));
    let mut machine = machine::Machine::create(&built, &plugins, &logs)?;
    let outcome = run_on(&mut machine, args, &built, &crane, &images, &logs);
    heading("critest: tear-down");
    let left = machine.tear_down();
    listed.removed();
    let seconds = started.elapsed().as_secs_f64();
    let (specs, runtime) = outcome?;
    println!("{}", report::table(&specs));
    println!("{runtime}");
    if args.focus.is_none() {
        let header = header(&built, seconds, &left);
        let path = util::root().join("results/critest.md");
        let text = report::markdown(&header, &specs) + &runtime;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("critest: wrote {}", path.display());
    }
    println!("critest: {seconds:.0} s in all; logs in {}", logs.display());
    if !left.is_empty() {
        bail!(
            "the pod network was not empty after every sandbox was removed:\n{}",
            left.join("\n")
        );
    }
    Ok(())
}

fn run_on(
    machine: &mut machine::Machine,
    args: &CritestArgs,
    built: &Built,
    crane: &Path,
    images: &[(Vec<String>, PathBuf)],
    logs: &Path,
) -> anyhow::Result<(Vec<report::Spec>, String)> {
    machine.serve_images(crane, images)?;
    machine.start_containerd(built)?;
    heading("critest: the suite");
    let report_dir = logs.join("junit");
    std::fs::create_dir_all(&report_dir)?;
    let endpoint = format!("unix://{}", names::SOCKET);
    let mut cmd = machine.command(built.bin("critest"));
    cmd.arg(format!("--runtime-endpoint={endpoint}"))
        .arg(format!("--image-endpoint={endpoint}"))
        .arg("--ginkgo.no-color")
        .arg(format!(
            "--ginkgo.junit-report={}",
            report_dir.join("junit_critest.xml").display()
        ))
        .arg(format!("--ginkgo.skip={}", report::skip_expression()))
        // Its mount-propagation specs' folders and pod logs: in the
        // machine's own /tmp.
        .env("TMPDIR", "/tmp")
        .current_dir(&report_dir);
    if let Some(focus) = &args.focus {
        cmd.arg(format!("--ginkgo.focus={focus}"));
    }
    let log = logs.join("critest.log");
    println!("critest: running; its output goes to {}", log.display());
    let status = machine.host.spawn(cmd, &log)?.wait()?;
    machine.check()?;
    let specs = report::read(&report_dir).with_context(|| {
        format!(
            "critest ({status}) wrote no readable report; the end of {}:\n{}",
            log.display(),
            super::daemon::tail(&log, 40)
        )
    })?;
    if specs.is_empty() {
        bail!("critest ({status}) ran no spec; see {}", log.display());
    }
    heading("critest: sandboxes whose CNI ADD is killed");
    let mid_add = runtime_cni::kill_mid_add(machine, &built.bin("crictl"))?;
    machine.check()?;
    let cni_log = machine
        .host
        .dir
        .join("root")
        .join(names::CNI_LOG.trim_start_matches('/'));
    let verbs = runtime_cni::tally(&std::fs::read_to_string(&cni_log).unwrap_or_default());
    let _ = std::fs::copy(&cni_log, logs.join("flatnet-cni.log"));
    let runtime = runtime_cni::markdown(&verbs, &mid_add);
    if !mid_add.left.is_empty() || mid_add.runp_failed < mid_add.killed || mid_add.killed == 0 {
        bail!("a sandbox whose ADD was killed:{runtime}");
    }
    Ok((specs, runtime))
}

fn header(built: &Built, seconds: f64, left: &[String]) -> String {
    let git = |args: &[&str]| {
        util::output(Command::new("git").arg("-C").arg(util::root()).args(args))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let date =
        util::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M"])).unwrap_or_default();
    format!(
        "{} UTC, commit {}, `cargo xtask critest` in {seconds:.0} s: critest {} against containerd {} \
         (both from e2e-build's cache, {}), Debian's runc, flatnet's release build with the reference \
         portmap and loopback plugins {} of the same build, CNI 1.1.0 (network `{}`, {}), on network, mount, UTS and IPC namespaces of its own. \
         Images: stand-ins built from Debian's busybox-static (see xtask/src/e2e/images/critest_images.rs), \
         pulled from a registry on that namespace's loopback (go-containerregistry's `crane registry serve`). \
         After every sandbox was removed: {}.",
        date.trim(),
        git(&["describe", "--always", "--dirty"]),
        build::CRI_TOOLS_VERSION,
        build::CONTAINERD_VERSION,
        built.bin_dir.display(),
        build::CNI_PLUGINS_VERSION,
        machine::NETWORK,
        machine::SUBNET,
        if left.is_empty() {
            "no pin, link or address of the network left".to_string()
        } else {
            left.join("; ")
        },
    )
}

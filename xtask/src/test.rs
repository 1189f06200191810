//! The whole test suite: formatting and lints, unit tests, and the
//! integration tests (as root, against the real kernel) in `tests/`.

use flatnet_harness::REQUIRE_ROOT_ENV;

use crate::util::{self, heading, run_cmd};

#[derive(clap::Args)]
pub struct TestArgs {
    /// Only run tests whose name contains this.
    pub filter: Option<String>,
    /// Skip rustfmt and clippy.
    #[arg(long)]
    pub no_lint: bool,
    /// Skip the benchmark's smoke round.
    #[arg(long)]
    pub no_bench: bool,
    /// Skip the fuzz smoke stage.
    #[arg(long)]
    pub no_fuzz: bool,
    /// Seconds each fuzz target runs in the smoke stage.
    #[arg(long, default_value_t = 10)]
    pub fuzz_seconds: u32,
    /// Skip the real-cluster stage (`cargo xtask e2e`'s CI subset).
    #[arg(long)]
    pub no_e2e: bool,
}

/// rustup's `cargo +<the eBPF toolchain>` (`$CARGO` is stable's own
/// binary, which knows no `+toolchain`), with .tools/bin (cargo-fuzz) on
/// PATH; on stable, `RUSTC_BOOTSTRAP=1` for the sanitizer's `-Z` flags.
fn nightly_cargo() -> std::process::Command {
    let path = util::cargo()
        .get_envs()
        .find_map(|(key, value)| (key == "PATH").then_some(value).flatten())
        .map(ToOwned::to_owned);
    let mut cmd = std::process::Command::new("cargo");
    let toolchain = util::ebpf_toolchain();
    // Set by the stable cargo running xtask; +toolchain must win.
    cmd.arg(format!("+{toolchain}"))
        .current_dir(util::root())
        .env_remove("RUSTUP_TOOLCHAIN");
    if toolchain != "nightly" {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    cmd
}

/// Each cargo-fuzz target in tests/fuzz (parsers of what a runtime sends;
/// the list is tests/fuzz/Cargo.toml's, as `cargo fuzz list` prints it) for
/// a bounded time: a crash fails the stage, and the input that caused it is
/// left in tests/fuzz/artifacts/<target>/ (turn it into a unit test).
/// Longer by hand: `cargo xtask fuzz --seconds 3600`.
/// `dev`: the dev profile (debug assertions, overflow checks, the
/// sanitizer), for the suite's smoke: for 10 s a target, the release
/// build's optimisation costs more time than its faster runs give back
/// (4.4 min cold on 2 cores). Longer runs want the release build.
pub fn fuzz_smoke(seconds: u32, dev: bool) -> anyhow::Result<()> {
    let profile: &[&str] = if dev { &["--dev"] } else { &[] };
    let fuzz_dir = util::root().join("tests/fuzz");
    let mut list = nightly_cargo();
    list.args(["fuzz", "list", "--fuzz-dir"]).arg(&fuzz_dir);
    let listed = util::output(&mut list)?;
    let targets: Vec<&str> = listed.split_whitespace().collect();
    anyhow::ensure!(!targets.is_empty(), "`cargo fuzz list` names no target");
    heading(&format!(
        "fuzz smoke: {} targets ({}), {seconds} s each",
        targets.len(),
        targets.join(", ")
    ));
    let mut build = nightly_cargo();
    build
        .args(["fuzz", "build"])
        .args(profile)
        .arg("--fuzz-dir")
        .arg(&fuzz_dir);
    run_cmd(&mut build)?;
    for target in targets {
        // New inputs go to tests/fuzz/corpus (ignored by git), which grows
        // run to run; the committed seeds start it with valid documents.
        let corpus = fuzz_dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        let mut run = nightly_cargo();
        run.args(["fuzz", "run"])
            .args(profile)
            .arg("--fuzz-dir")
            .arg(&fuzz_dir)
            .arg(target)
            .arg(&corpus)
            .arg(fuzz_dir.join("seeds").join(target))
            .arg("--")
            .arg(format!("-dict={}", fuzz_dir.join("json.dict").display()))
            .arg(format!("-max_total_time={seconds}"))
            .arg("-max_len=65536")
            .arg("-print_final_stats=1");
        run_cmd(&mut run)?;
    }
    Ok(())
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    // What a killed run left goes first (its forwarding switches put back
    // before they are saved); this run's record is kept until it ends, for
    // the next run should this one be killed.
    let _record = if util::is_root() {
        Some(crate::suite_record::SuiteRecord::begin(&util::target_dir(
            false,
        ))?)
    } else {
        None
    };
    // The suite starts each part from forwarding off itself; the node is
    // left as it was found.
    let _forwarding = util::SavedForwarding::now();
    let e2e = !args.no_e2e && args.filter.is_none();
    let release = crate::e2e::build::DEFAULT_RELEASE.parse()?;
    crate::disk::check(&disk_needs(e2e, &release))?;
    // Kubernetes builds while the Rust tests run (see `BackgroundBuild`).
    let e2e_build = if e2e && util::is_root() {
        crate::e2e::build::BackgroundBuild::start(&release)?
    } else {
        None
    };
    if !args.no_lint {
        heading("lint: rustfmt (clippy's lints run in the debug build)");
        run_cmd(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
        util::lint_while_building()?;
    }
    util::build(false, &[])?;
    if !util::is_root() {
        println!(
            "\n\x1b[1;33mNOT ROOT: the integration tests will fail (they need root for network namespaces, veths and BPF, and {REQUIRE_ROOT_ENV}=1 makes a test that cannot run fail); run as root\x1b[0m"
        );
    }
    heading("tests: unit and integration");
    let mut cmd = util::cargo();
    // A test that cannot run here (not root, a tool missing) fails instead
    // of skipping: the suite never reports ok without having run.
    cmd.args(["test", "--workspace", "--exclude", "flatnet-ebpf"])
        .env("FLATNET_BIN_DIR", util::target_dir(false))
        .env(REQUIRE_ROOT_ENV, "1");
    if let Some(filter) = &args.filter {
        cmd.args(["--", filter]);
    }
    // Namespaces, links, pins, run state, cgroups, scratch folders, bpffs
    // mounts and processes of the build: what is new afterwards leaked.
    let bin_dir = util::target_dir(false);
    let before = flatnet_harness::NodeObjects::now(&bin_dir);
    // Listed also when a test failed: a leak may be what made it fail.
    let tests = run_cmd(&mut cmd);
    let leaked = flatnet_harness::left_since(&before, &bin_dir, flatnet_harness::SETTLE_AFTER_RUN);
    if let Err(failed) = tests {
        anyhow::ensure!(
            leaked.is_empty(),
            "{failed:#}; and the tests left on the node:\n  {}",
            leaked.join("\n  ")
        );
        return Err(failed);
    }
    anyhow::ensure!(
        leaked.is_empty(),
        "the tests left {} object(s) on the node (each test removes what it makes, also when it fails):\n  {}",
        leaked.len(),
        leaked.join("\n  ")
    );
    if !args.no_fuzz && args.filter.is_none() {
        fuzz_smoke(args.fuzz_seconds, true)?;
    }
    if !args.no_bench && args.filter.is_none() && util::is_root() {
        heading(
            "bench smoke: one short round of `cargo xtask bench` on the debug build (numbers not asserted)",
        );
        crate::bench::run(&crate::bench::BenchArgs {
            rounds: 1,
            seconds: 1,
            sequential: 5,
            concurrent: 4,
            smoke: true,
            out: None,
            program_cost: false,
            overlay: false,
            services: false,
            before: None,
        })?;
        heading(
            "scale smoke: the agent on the smallest synthetic cluster, idle and churned, on the debug build (numbers not asserted, probe verdicts are)",
        );
        crate::scale::run(&crate::scale::ScaleArgs {
            sizes: Vec::new(),
            idle_secs: 3,
            churn_secs: 5,
            rate: 64.0,
            smoke: true,
            real_api: Vec::new(),
            out: None,
        })?;
    }
    if e2e {
        if let Some(build) = e2e_build {
            heading("e2e: waiting for the background build of Kubernetes");
            build.wait();
        }
        heading(
            "e2e: a real two-node cluster with kube-proxy's Services (iptables, nftables), the upstream suites' CI subset (`cargo xtask e2e --full` runs the rest)",
        );
        // The debug build the suite has just tested; `cargo xtask e2e`
        // alone deploys the release build, as users do.
        use crate::e2e::ServicesMode;
        let ipv4 = crate::e2e::E2eArgs {
            full: false,
            services: vec![ServicesMode::KubeProxy, ServicesMode::KubeProxyNftables],
            focus: None,
            kubernetes: release,
            dual_stack: false,
            nodes: 2,
            keep: false,
            debug_build: true,
            clean_up: false,
        };
        crate::e2e::run(&ipv4)?;
        // eBPF Services on a dual-stack cluster, where flatnet does the most
        // itself (both families, kube-proxy absent): its IPv4 specs are
        // those the IPv4 clusters run, so an IPv4-only eBPF cluster would
        // repeat them (3.5 min); `cargo xtask e2e` runs one.
        heading("e2e: a dual-stack cluster with eBPF Services");
        crate::e2e::run(&crate::e2e::E2eArgs {
            services: vec![ServicesMode::Ebpf],
            dual_stack: true,
            ..ipv4
        })?;
    }
    Ok(())
}

/// What the suite writes, at the size each reaches in a run from nothing
/// (CI's clean checkout with warm caches, and a machine's first run).
fn disk_needs(e2e: bool, release: &crate::e2e::build::Release) -> Vec<crate::disk::Need> {
    use crate::disk::{GIB, Need};
    let mut needs = vec![Need {
        path: util::root().join("target"),
        what: "the build (target/)",
        full_size: TARGET_FULL_SIZE,
    }];
    if !e2e {
        return needs;
    }
    needs.push(Need {
        path: crate::e2e::build::cache_root(release),
        what: "the Kubernetes release and images",
        full_size: 2 * GIB,
    });
    if !crate::e2e::build::is_built(release) {
        // Go's caches after one release's build (binaries, e2e.test and
        // the images' tools), from this machine's.
        for (variable, what, size) in [
            ("GOMODCACHE", "Go's module cache", 2 * GIB),
            ("GOCACHE", "Go's build cache", 4 * GIB),
        ] {
            if let Some(path) = go_env(variable) {
                needs.push(Need {
                    path,
                    what,
                    full_size: size,
                });
            }
        }
    }
    // The e2e machines' folders: logs, kubelets' and CNI state (their
    // container stores are in memory, `e2e::host`).
    needs.push(Need {
        path: crate::e2e::STATE_DIR.into(),
        what: "the e2e machines",
        full_size: GIB,
    });
    needs
}

/// target/ at the end of a CI run from a clean checkout: 5.1 GiB measured
/// (bbc8fe8, `CI=true`, 2026-11-30), and room for growth.
const TARGET_FULL_SIZE: u64 = 8 * crate::disk::GIB;

/// A `go env` variable, when Go is there to say it.
fn go_env(variable: &str) -> Option<std::path::PathBuf> {
    let out = std::process::Command::new("go")
        .args(["env", variable])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.into())
}

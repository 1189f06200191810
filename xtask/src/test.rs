//! The whole test suite: formatting and lints, unit tests, and the
//! integration tests (as root, against the real kernel) in `tests/`.

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
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    if !args.no_lint {
        heading("lint: rustfmt and clippy");
        run_cmd(util::cargo().args(["fmt", "--all", "--", "--check"]))?;
        run_cmd(util::cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    }
    util::build(false)?;
    if !util::is_root() {
        println!(
            "\n\x1b[1;33mNOT ROOT: the integration tests will report SKIPPED; run as root for the real suite\x1b[0m"
        );
    }
    heading("tests: unit and integration");
    let mut cmd = util::cargo();
    cmd.args(["test", "--workspace", "--exclude", "flatnet-ebpf"])
        .env("FLATNET_BIN_DIR", util::target_dir(false));
    if let Some(filter) = &args.filter {
        cmd.args(["--", filter]);
    }
    run_cmd(&mut cmd)?;
    if !args.no_bench && args.filter.is_none() && util::is_root() {
        heading("bench smoke: one short round of `cargo xtask bench` (numbers not asserted)");
        crate::bench::run(&crate::bench::BenchArgs {
            rounds: 1,
            seconds: 1,
            sequential: 5,
            concurrent: 4,
            smoke: true,
            out: None,
        })?;
    }
    Ok(())
}

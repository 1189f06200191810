//! `cargo xtask`: everything around the code — set-up of a fresh machine,
//! build, install, the live demo, the test suite and the benchmark.

mod bench;
mod cni;
mod code_map;
mod demo;
mod disk;
mod e2e;
#[cfg(test)]
mod flag_tables;
mod install;
mod markers;
mod prose;
mod scale;
mod setup;
mod suite_record;
mod test;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "flatnet developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (rust-src, bpf-linker, Debian packages).
    Setup,
    /// Set up, then build the plugin binaries (the eBPF object is embedded).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build (release) and install the binaries and a conflist.
    Install(install::InstallArgs),
    /// Set up, build, install, then run two pods through the eBPF datapath.
    Demo(install::InstallArgs),
    /// Set up, build, and run every test (unit, integration as root, lint).
    Test(test::TestArgs),
    /// Set up, then run each cargo-fuzz target (tests/fuzz) for a while.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 300)]
        seconds: u32,
    },
    /// Set up, build, and benchmark flatnet against the kernel bridge and a bare veth.
    Bench(bench::BenchArgs),
    /// Write docs/benchmarks.md and the README's benchmark table from results/ (no measuring),
    /// results/e2e.md from the e2e-<mode>.json beside it, and the code map in
    /// docs/development.md from the Rust files' `//!` lines.
    Docs,
    /// Build Kubernetes (the servers, kubelet, kube-proxy, e2e.test, agnhost), etcd,
    /// containerd 2, cri-tools and pause from their Go modules, in $FLATNET_CACHE.
    E2eBuild {
        /// The Kubernetes release (major.minor.patch).
        #[arg(long, default_value = e2e::build::DEFAULT_RELEASE)]
        kubernetes: e2e::build::Release,
    },
    /// A cluster of real kubelets, kube-proxy, API server and containerd
    /// with flatnet as its CNI, and the upstream sig-network and
    /// NetworkPolicy e2e suites of the same release run on it.
    E2e(e2e::E2eArgs),
    /// The agent against synthetic clusters up to 5,000 nodes and 150,000
    /// pods, idle and churned, its pods probing; writes results/scale.*.
    Scale(scale::ScaleArgs),
    /// cri-tools' CRI validation suite (critest) against containerd 2
    /// with flatnet as its CNI; writes results/critest.md.
    Critest(e2e::critest::CritestArgs),
}

fn main() -> anyhow::Result<()> {
    util::started();
    match Cli::parse().task {
        Task::Setup => setup::all(),
        Task::Build { release } => {
            setup::all()?;
            util::build(release, &[])
        }
        Task::Install(args) => {
            setup::all()?;
            install::install(&args)
        }
        Task::Demo(args) => {
            // ^C or a timeout still takes the demo's namespaces back.
            flatnet_harness::remove_on_signal()?;
            setup::all()?;
            install::install(&args)?;
            demo::run(&args)
        }
        Task::Test(args) => {
            setup::all()?;
            test::run(&args)
        }
        Task::Fuzz { seconds } => {
            setup::all()?;
            test::fuzz_smoke(seconds, false)
        }
        Task::Bench(args) => {
            // As for the demo: the bench's own namespaces and its children
            // (the bench binaries, which clean up after themselves too).
            flatnet_harness::remove_on_signal()?;
            setup::all()?;
            bench::run(&args)
        }
        Task::Docs => {
            let root = util::root();
            scale::redraw(&root.join("results"))?;
            bench::docs::write(&root)?;
            e2e::write_summary(&root.join("results"))?;
            code_map::write(&root)
        }
        Task::E2e(args) => {
            setup::all()?;
            e2e::run(&args)
        }
        Task::Critest(args) => e2e::critest::run(&args),
        Task::Scale(args) => {
            flatnet_harness::remove_on_signal()?;
            setup::all()?;
            scale::run(&args)
        }
        Task::E2eBuild { kubernetes } => {
            let built = e2e::build::prepare(&kubernetes)?;
            println!("{built}");
            Ok(())
        }
    }
}

//! flatnet-cluster-dns: cluster DNS for flatnet's real-cluster e2e
//! harness, in place of CoreDNS (not packaged in Debian, and its Go
//! modules cannot be fetched here). It serves the Kubernetes DNS schema
//! for the cluster zone and the reverse zones from the API server's
//! Services and EndpointSlices, refuses every other name, and never forwards a
//! query anywhere: there is no upstream, by design. See the library's doc
//! (src/lib.rs) for the records. Logs are JSON lines on stderr.
//!
//! Called `coredns` or with `-conf FILE`, it is the CoreDNS of the e2e
//! suite's agnhost image instead: it serves the `hosts` entries of a
//! Corefile (see the library's `coredns` module); logs are text lines.
use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use flatnet_cluster_dns::Args;
use flatnet_cluster_dns::coredns::{self, Invocation};
use flatnet_cluster_dns::error::ArgsError;
use tracing_subscriber::EnvFilter;

/// Go's flag package exits with 2 on a bad command line.
const USAGE_EXIT: u8 = 2;

fn block_on<T>(future: impl Future<Output = T>) -> Option<T> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime.block_on(future)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            None
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(invocation) = Invocation::from_args(&args) {
        return coredns_main(invocation);
    }
    let args = Args::parse_from(args);
    let filter = EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match block_on(flatnet_cluster_dns::run(args)) {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            tracing::error!(error = %e, "flatnet-cluster-dns failed");
            ExitCode::FAILURE
        }
        None => ExitCode::FAILURE,
    }
}

/// The CoreDNS mode: text logs on stderr, as CoreDNS's.
fn coredns_main(invocation: Result<Invocation, ArgsError>) -> ExitCode {
    let conf = match invocation {
        Ok(Invocation::Serve { conf }) => conf,
        Ok(Invocation::Help) => {
            print!("{}", coredns::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("{e}\n{}", coredns::USAGE);
            return ExitCode::from(USAGE_EXIT);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(coredns::LOG_FILTER))
        .with_target(false)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    match block_on(coredns::run(&conf)) {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
        None => ExitCode::FAILURE,
    }
}

//! flatnet-cluster-dns: cluster DNS for flatnet's real-cluster e2e
//! harness, in place of CoreDNS (not packaged in Debian, and its Go
//! modules cannot be fetched here). It serves the Kubernetes DNS schema
//! for the cluster zone and the reverse zones from the API server's
//! Services and Endpoints, refuses every other name, and never forwards a
//! query anywhere: there is no upstream, by design. See the library's doc
//! (src/lib.rs) for the records. Logs are JSON lines on stderr.
use std::process::ExitCode;

use clap::Parser;
use flatnet_cluster_dns::Args;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(flatnet_cluster_dns::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "flatnet-cluster-dns failed");
            ExitCode::FAILURE
        }
    }
}

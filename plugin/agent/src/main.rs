//! flatnet's node agent: `flatnet-agent --node-name NODE [...]`, or
//! `flatnet-agent --uninstall [...]` once its DaemonSet is gone (see
//! `flatnet-agent --help`). Logs are JSON lines on stderr.
use std::process::ExitCode;

use clap::Parser;
use flatnet_agent::config::Args;
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
    let outcome = if args.uninstall {
        runtime.block_on(flatnet_agent::uninstall(args))
    } else {
        runtime.block_on(flatnet_agent::run(args))
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "flatnet-agent failed");
            ExitCode::FAILURE
        }
    }
}

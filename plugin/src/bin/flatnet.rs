//! The flatnet CNI plugin, run by a container runtime with CNI_COMMAND set.
use std::io::Write;

fn main() -> std::process::ExitCode {
    flatnet::trace::start();
    let status = flatnet::runner::run_cni();
    flatnet::trace::report(&std::env::var("CNI_COMMAND").unwrap_or_default());
    // The answer must be out before the reaper forks (a copy of an unflushed
    // buffer would be printed twice).
    let _ = std::io::stdout().flush();
    flatnet::reaper::finish();
    status
}

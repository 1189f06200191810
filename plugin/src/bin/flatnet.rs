//! The flatnet CNI plugin. A runtime runs it with CNI_COMMAND set; a person
//! runs its subcommands (`flatnet inspect`, `flatnet repair`).
use std::io::Write;

fn main() -> std::process::ExitCode {
    if std::env::var_os("CNI_COMMAND").is_none() && std::env::args_os().len() > 1 {
        return flatnet::cli::main();
    }
    flatnet::trace::start();
    let status = flatnet::runner::run_cni();
    flatnet::trace::report(&std::env::var("CNI_COMMAND").unwrap_or_default());
    // The answer must be out before the reaper forks (a copy of an unflushed
    // buffer would be printed twice).
    let _ = std::io::stdout().flush();
    flatnet::reaper::finish();
    status
}

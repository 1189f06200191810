//! The flatnet CNI plugin, run by a container runtime with CNI_COMMAND set.
fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(flatnet::reaper::REAP_ARG) {
        return flatnet::reaper::run(&args[1..]);
    }
    flatnet::trace::start();
    let status = flatnet::runner::run_cni();
    flatnet::trace::report(&std::env::var("CNI_COMMAND").unwrap_or_default());
    status
}

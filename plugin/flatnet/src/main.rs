//! The flatnet CNI plugin. A runtime runs it with CNI_COMMAND set; a person
//! runs its subcommands (`flatnet inspect`, `flatnet repair`).

fn main() -> std::process::ExitCode {
    if std::env::var_os("CNI_COMMAND").is_none() && std::env::args_os().len() > 1 {
        return flatnet::cli::main();
    }
    flatnet_datapath::trace::start();
    let status = flatnet::dispatch::run_cni();
    flatnet_datapath::trace::report(&std::env::var("CNI_COMMAND").unwrap_or_default());
    status
}

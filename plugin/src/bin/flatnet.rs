//! The flatnet CNI plugin, run by a container runtime with CNI_COMMAND set.
fn main() -> std::process::ExitCode {
    flatnet::runner::run_cni()
}

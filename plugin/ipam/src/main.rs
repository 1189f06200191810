//! The flatnet-ipam IPAM plugin, run by a CNI plugin (or a runtime) with CNI_COMMAND set.
fn main() -> std::process::ExitCode {
    flatnet_cni::runner::run(&flatnet_ipam::PLUGIN)
}

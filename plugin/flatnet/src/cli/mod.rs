//! The `flatnet` binary run by a person (no CNI_COMMAND): subcommands to
//! inspect, monitor and repair the datapath.

pub mod inspect;
pub mod inspect_remote;
pub mod inspect_services;
pub mod monitor;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::NetConf;
use crate::error::{Error, Result};
use flatnet_datapath::bpf::{self};
use flatnet_datapath::netlink::Netlink;
use flatnet_datapath::node::{ensure_datapath, reattach_all};

#[derive(Parser)]
#[command(
    name = "flatnet",
    // The datapath build too: flatnet-agent compares it with its own.
    version = flatnet_datapath::bpf::BUILD_VERSION,
    about = "flatnet: a CNI plugin with an eBPF datapath.",
    long_about = "A container runtime runs flatnet with CNI_COMMAND set (ADD, DEL, CHECK, STATUS, GC, VERSION) \
                  and the network configuration on stdin. These subcommands are for people."
)]
struct Cli {
    #[command(subcommand)]
    command: Subcommands,
}

#[derive(Subcommand)]
enum Subcommands {
    /// Pods, counters, programs and pins of each network's datapath.
    Inspect {
        /// Only this network (default: every network with pinned state).
        #[arg(long)]
        network: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// The Service frontends and backends of the socket programs
        /// (`--services ebpf`) instead of the pods.
        #[arg(long)]
        services: bool,
    },
    /// Stream the packets NetworkPolicy drops on a network, one line each
    /// (time, pod, direction, peer, protocol/port, reason) until Ctrl-C.
    Monitor {
        /// The network to watch.
        #[arg(long, default_value = "flatnet")]
        network: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Reload a network's datapath and rebuild its maps from the pods that
    /// exist (after bpffs was remounted, say), re-attaching every pod's veth.
    Repair {
        /// The conflist (or single plugin configuration) of the network.
        #[arg(long, default_value = "/etc/cni/net.d/10-flatnet.conflist")]
        conf: PathBuf,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("flatnet: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Subcommands::Inspect {
                network,
                json,
                services,
            } => {
                if services {
                    run_inspect_services(network, json)
                } else {
                    run_inspect(network, json).await
                }
            }
            Subcommands::Monitor { network, json } => {
                crate::cli::monitor::run(&network, json).await
            }
            Subcommands::Repair { conf } => run_repair(&conf).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flatnet: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inspect_services(network: Option<String>, json: bool) -> Result<()> {
    let networks = match network {
        Some(name) => vec![name],
        None => inspect::pinned_networks(),
    };
    let reports = networks
        .iter()
        .map(|name| crate::cli::inspect_services::report(name))
        .collect::<Result<Vec<_>>>()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else {
        for report in &reports {
            print!("{}", crate::cli::inspect_services::render(report));
        }
    }
    Ok(())
}

async fn run_inspect(network: Option<String>, json: bool) -> Result<()> {
    let host = Netlink::connect()?;
    let networks = match network {
        Some(name) => vec![name],
        None => inspect::pinned_networks(),
    };
    let mut reports = Vec::new();
    for name in &networks {
        reports.push(inspect::network(name, &host).await?);
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else if reports.is_empty() {
        println!(
            "no flatnet network has pinned state under {}",
            flatnet_common::PIN_ROOT
        );
    } else {
        for report in &reports {
            println!("{}", inspect::render(report));
        }
    }
    Ok(())
}

/// The flatnet plugin configuration in a conflist (or a plain plugin config),
/// with the list's name and version filled in as a runtime would.
fn plugin_conf(path: &std::path::Path) -> Result<NetConf> {
    let text =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let value: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| Error::decode(path.display().to_string(), e))?;
    let conf = match value.get("plugins").and_then(|p| p.as_array()) {
        Some(plugins) => {
            let mut plugin = plugins
                .iter()
                .find(|p| p["type"] == "flatnet")
                .cloned()
                .ok_or_else(|| {
                    Error::config(format!("{} has no flatnet plugin", path.display()))
                })?;
            plugin["name"] = value["name"].clone();
            plugin["cniVersion"] = value["cniVersion"].clone();
            plugin
        }
        None => value,
    };
    Ok(NetConf::parse(conf.to_string().as_bytes())?)
}

async fn run_repair(path: &std::path::Path) -> Result<()> {
    let conf = plugin_conf(path)?;
    let host = Netlink::connect()?;
    let datapath = conf.pinned_datapath()?;
    bpf::ensure_bpffs_at(datapath.root())?;
    let _lock = ensure_datapath(&conf.node_network(), &datapath, &host).await?;
    // Whatever happened before, every pod's veth runs this build's program now.
    let attached = reattach_all(&datapath, conf.datapath, &host).await?;
    println!(
        "network {}: {} datapath pinned at {}, {attached} pod(s) attached",
        conf.name,
        conf.datapath.as_str(),
        datapath.pin_dir().display()
    );
    Ok(())
}

//! `flatnet inspect`: what the datapath of each network holds and does —
//! pods, their counters, the programs and where they are attached, the
//! pinned paths — as a table for people or JSON for scripts.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use flatnet_common::{MAPS, PIN_ROOT, PROG_FROM_POD, action};
use serde::Serialize;

use crate::cni::config::DatapathMode;
use crate::cni::error::Result;
use crate::datapath::{DATAPATH_ID, Datapath, attach_mode, ingress_programs, programs};
use crate::net::{Netlink, format_mac};

#[derive(Debug, Serialize)]
pub struct NetworkReport {
    pub network: String,
    pub datapath: Option<&'static str>,
    /// How programs are attached on this kernel: tcx links or netlink filters.
    pub attach: &'static str,
    pub pin_dir: String,
    /// Pinned programs: name -> kernel ID.
    pub programs: BTreeMap<String, u32>,
    pub maps: Vec<String>,
    /// Action counters summed over CPUs: name -> (packets, bytes).
    pub counters: BTreeMap<&'static str, Counts>,
    pub pods: Vec<PodReport>,
}

#[derive(Debug, Serialize, Clone, Copy)]
pub struct Counts {
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct PodReport {
    pub addresses: Vec<IpAddr>,
    pub pod_mac: String,
    pub host_veth: Option<String>,
    pub host_ifindex: u32,
    pub host_mac: String,
    /// Kernel ID of the program attached to the host veth, if any.
    pub attached_program: Option<u32>,
    /// True when that is this build's program.
    pub current_program: bool,
    pub tx: Counts,
    pub rx: Counts,
}

/// Network names with something pinned, from the pin directories.
pub fn pinned_networks() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(PIN_ROOT) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        // Undo `datapath::pin_name`: '~' stands for '.'.
        .map(|name| name.replace('~', "."))
        .collect();
    names.sort();
    names
}

pub async fn network(network: &str, host: &Netlink) -> Result<NetworkReport> {
    let datapath = Datapath::new(network);
    let mode = datapath.pinned_mode();
    let mut report = NetworkReport {
        network: network.to_string(),
        datapath: mode.map(DatapathMode::as_str),
        attach: attach_mode().describe(),
        pin_dir: datapath.pin_dir().display().to_string(),
        programs: BTreeMap::new(),
        maps: MAPS
            .iter()
            .map(|m| datapath.map_path(m))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect(),
        counters: BTreeMap::new(),
        pods: Vec::new(),
    };
    for name in datapath.pinned_programs() {
        let id = aya::programs::ProgramInfo::from_pin(datapath.pin_dir().join(&name))
            .map(|info| info.id())
            .unwrap_or(0);
        report.programs.insert(name, id);
    }
    if !report.maps.is_empty() {
        let stats = datapath.stats()?;
        for (index, name) in action::NAMES.iter().enumerate() {
            report.counters.insert(
                name,
                Counts {
                    packets: stats[index].packets,
                    bytes: stats[index].bytes,
                },
            );
        }
    }
    let current_id = mode
        .filter(|m| datapath.is_loaded(*m))
        .and_then(|m| datapath.program(programs(m)[0]).ok())
        .and_then(|p| p.id().ok());
    let mut addresses: BTreeMap<u32, Vec<IpAddr>> = BTreeMap::new();
    if !report.maps.is_empty() {
        for (ip, endpoint) in datapath.all_endpoints()? {
            addresses.entry(endpoint.host_ifindex).or_default().push(ip);
        }
    }
    let veths = if report.maps.is_empty() {
        Vec::new()
    } else {
        datapath.host_veths()?
    };
    for (index, endpoint) in veths {
        let link = host.link_by_index(index).await?;
        let attached = match (mode, &link) {
            (Some(DatapathMode::Xdp), Some(link)) => link.xdp_prog_id,
            (Some(DatapathMode::Tc), Some(link)) => ingress_programs(host, index, &link.name)
                .await?
                .into_iter()
                .find(|(_, name)| name == PROG_FROM_POD)
                .map(|(id, _)| id),
            _ => None,
        };
        let counters = datapath.slot_counters(endpoint.counter_slot)?;
        let mut pod_addresses = addresses.remove(&index).unwrap_or_default();
        pod_addresses.sort();
        report.pods.push(PodReport {
            addresses: pod_addresses,
            pod_mac: format_mac(&endpoint.pod_mac),
            host_veth: link.map(|l| l.name),
            host_ifindex: index,
            host_mac: format_mac(&endpoint.host_mac),
            attached_program: attached,
            current_program: attached.is_some() && attached == current_id,
            tx: Counts {
                packets: counters.tx_packets,
                bytes: counters.tx_bytes,
            },
            rx: Counts {
                packets: counters.rx_packets,
                bytes: counters.rx_bytes,
            },
        });
    }
    report.pods.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    Ok(report)
}

/// The human form of a report.
pub fn render(report: &NetworkReport) -> String {
    let mut out = String::new();
    let mode = report.datapath.unwrap_or("none");
    out.push_str(&format!(
        "network {}  (datapath {mode}, pinned at {})\n",
        report.network, report.pin_dir
    ));
    let programs: Vec<String> = report
        .programs
        .iter()
        .map(|(name, id)| format!("{name} (id {id})"))
        .collect();
    out.push_str(&format!(
        "  programs: {}   [this build: {DATAPATH_ID}]\n",
        programs.join(", ")
    ));
    out.push_str(&format!("  attached: {}\n", report.attach));
    out.push_str(&format!(
        "  maps:     {}\n",
        report
            .maps
            .iter()
            .map(|m| short(m))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let counters: Vec<String> = report
        .counters
        .iter()
        .map(|(name, c)| format!("{name} {} pkts / {} B", c.packets, c.bytes))
        .collect();
    out.push_str(&format!("  counters: {}\n", counters.join("; ")));
    out.push_str(&format!(
        "  {:<34} {:<17} {:<15} {:>7} {:>10} {:>12} {:>14} {:>12} {:>14}\n",
        "POD ADDRESSES",
        "POD MAC",
        "HOST VETH",
        "IFINDEX",
        "PROGRAM",
        "TX PACKETS",
        "TX BYTES",
        "RX PACKETS",
        "RX BYTES"
    ));
    for pod in &report.pods {
        let addresses: Vec<String> = pod.addresses.iter().map(ToString::to_string).collect();
        let program = match (pod.attached_program, pod.current_program) {
            (Some(id), true) => format!("{id}"),
            (Some(id), false) => format!("{id} (old)"),
            (None, _) => "NONE".to_string(),
        };
        out.push_str(&format!(
            "  {:<34} {:<17} {:<15} {:>7} {:>10} {:>12} {:>14} {:>12} {:>14}\n",
            addresses.join(", "),
            pod.pod_mac,
            pod.host_veth.as_deref().unwrap_or("(gone)"),
            pod.host_ifindex,
            program,
            pod.tx.packets,
            pod.tx.bytes,
            pod.rx.packets,
            pod.rx.bytes
        ));
    }
    if report.pods.is_empty() {
        out.push_str("  (no pods)\n");
    }
    out
}

fn short(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}

//! `flatnet inspect`: what the datapath of each network holds and does —
//! pods, their counters, the programs and where they are attached, the
//! pinned paths — as a table for people or JSON for scripts.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use flatnet_common::{
    MAP_POLICY_PODS, MAPS, PIN_ROOT, POLICY_DIR_INGRESS, POLICY_F_EGRESS, POLICY_F_INGRESS,
    PROG_FROM_POD, action,
};
use serde::Serialize;

use super::inspect_remote::{self as remote, RemoteReport, TunnelReport};
use crate::config::DatapathMode;
use crate::error::Result;
use flatnet_datapath::bpf::sizes::SIZED_MAPS;
use flatnet_datapath::bpf::{DATAPATH_ID, Datapath, attach_mode, ingress_programs, programs};
use flatnet_datapath::netlink::{Netlink, format_mac};

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
    /// The maps sized per node, as made: name -> most entries.
    pub map_sizes: BTreeMap<&'static str, u32>,
    /// Action counters summed over CPUs: name -> (packets, bytes).
    pub counters: BTreeMap<&'static str, Counts>,
    /// Other nodes' pod CIDRs the fast path knows (`REMOTE_CIDRS_*`).
    pub remote: Vec<RemoteReport>,
    /// The VXLAN device the fast path encapsulates into (`TUNNEL`).
    pub tunnel: Option<TunnelReport>,
    pub pods: Vec<PodReport>,
}

#[derive(Debug, Serialize, Clone, Copy, Default)]
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
    /// NetworkPolicy: None when the datapath has no policy maps.
    pub policy: Option<PodPolicyReport>,
}

/// A pod's NetworkPolicy as the datapath holds it.
#[derive(Debug, Serialize, Clone, Default)]
pub struct PodPolicyReport {
    pub ingress_isolated: bool,
    pub egress_isolated: bool,
    /// Entries of its table per direction (by prefix and by peer
    /// identity).
    pub ingress_rules: usize,
    pub egress_rules: usize,
    /// What policy dropped, per direction.
    pub ingress_drops: Counts,
    pub egress_drops: Counts,
    /// The policies selecting it, as the agent last wrote them
    /// (`/run/flatnet/policy-<network>.json`; empty without an agent).
    pub policies: Vec<String>,
}

/// Pod address -> the policies selecting that pod, from the agent's file
/// (none when it is missing or unreadable).
fn policy_names(network: &str) -> BTreeMap<IpAddr, Vec<String>> {
    std::fs::read(flatnet_datapath::node::markers::policy_names_file(network))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// The policy of the pod in counter slot `slot`.
fn pod_policy(
    datapath: &Datapath,
    slot: u32,
    addresses: &[IpAddr],
    names: &BTreeMap<IpAddr, Vec<String>>,
) -> Result<PodPolicyReport> {
    let state = datapath.pod_policy(slot)?;
    // Entries by prefix and by peer identity, per direction.
    let mut directions: Vec<u32> = datapath
        .pod_policy_rules(slot)?
        .into_iter()
        .map(|(direction, _)| direction)
        .collect();
    let by_identity = datapath.pod_policy_peers(slot)?;
    directions.extend(by_identity.iter().map(|(direction, _)| *direction));
    let ingress_rules = directions
        .iter()
        .filter(|direction| **direction == POLICY_DIR_INGRESS)
        .count();
    let drops = datapath.policy_drop_counts(slot)?;
    Ok(PodPolicyReport {
        ingress_isolated: state.flags & POLICY_F_INGRESS != 0,
        egress_isolated: state.flags & POLICY_F_EGRESS != 0,
        ingress_rules,
        egress_rules: directions.len() - ingress_rules,
        ingress_drops: Counts {
            packets: drops.ingress_packets,
            bytes: drops.ingress_bytes,
        },
        egress_drops: Counts {
            packets: drops.egress_packets,
            bytes: drops.egress_bytes,
        },
        policies: addresses
            .iter()
            .find_map(|ip| names.get(ip))
            .cloned()
            .unwrap_or_default(),
    })
}

/// Network names with something pinned, from the pin directories.
pub fn pinned_networks() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(PIN_ROOT) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        // Undo `bpf::pin_name`: '~' stands for '.'.
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
        map_sizes: SIZED_MAPS
            .iter()
            .filter_map(|m| Some((*m, datapath.capacity(m).ok().flatten()?)))
            .collect(),
        counters: BTreeMap::new(),
        remote: Vec::new(),
        tunnel: None,
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
    if !report.maps.is_empty() {
        (report.remote, report.tunnel) = remote::report(&datapath, host).await?;
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
    let with_policy = datapath.map_path(MAP_POLICY_PODS).exists();
    let names = if with_policy {
        policy_names(network)
    } else {
        BTreeMap::new()
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
        let policy = if with_policy && endpoint.counter_slot != flatnet_common::NO_COUNTER_SLOT {
            Some(pod_policy(
                &datapath,
                endpoint.counter_slot,
                &pod_addresses,
                &names,
            )?)
        } else {
            None
        };
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
            policy,
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
    if !report.map_sizes.is_empty() {
        let sizes: Vec<String> = report
            .map_sizes
            .iter()
            .map(|(name, entries)| format!("{name} {entries}"))
            .collect();
        out.push_str(&format!(
            "  sized:    {}
",
            sizes.join(", ")
        ));
    }
    let counters: Vec<String> = report
        .counters
        .iter()
        .map(|(name, c)| format!("{name} {} pkts / {} B", c.packets, c.bytes))
        .collect();
    out.push_str(&format!("  counters: {}\n", counters.join("; ")));
    out.push_str(&remote::render(&report.remote, report.tunnel.as_ref()));
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
    if report.pods.iter().any(|p| p.policy.is_some()) {
        out.push_str(&format!(
            "  {:<34} {:<9} {:<9} {:>8} {:>8} {:>12} {:>12}  {}\n",
            "POLICY OF POD",
            "INGRESS",
            "EGRESS",
            "RULES IN",
            "RULES OUT",
            "DROPPED IN",
            "DROPPED OUT",
            "POLICIES"
        ));
        for pod in &report.pods {
            let Some(policy) = &pod.policy else {
                continue;
            };
            let addresses: Vec<String> = pod.addresses.iter().map(ToString::to_string).collect();
            let isolation = |isolated: bool| if isolated { "isolated" } else { "open" };
            out.push_str(&format!(
                "  {:<34} {:<9} {:<9} {:>8} {:>9} {:>12} {:>12}  {}\n",
                addresses.join(", "),
                isolation(policy.ingress_isolated),
                isolation(policy.egress_isolated),
                policy.ingress_rules,
                policy.egress_rules,
                policy.ingress_drops.packets,
                policy.egress_drops.packets,
                if policy.policies.is_empty() {
                    "-".to_string()
                } else {
                    policy.policies.join(", ")
                }
            ));
        }
    }
    out
}

fn short(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}

//! `flatnet inspect --services`: the Service frontends a network's socket
//! programs balance (`--services ebpf`), each with its backends, and
//! whether the programs are attached.

use serde::Serialize;

use crate::error::Result;
use flatnet_datapath::bpf::{Datapath, backend_address, frontend_of};

#[derive(Debug, Serialize)]
pub struct ServicesReport {
    pub network: String,
    /// The socket programs attached through their pinned links.
    pub attached: bool,
    pub frontends: Vec<FrontendReport>,
    /// The node addresses NodePorts answer on (a NodePort's frontend has
    /// the unspecified address: "any of these").
    pub nodeport_addresses: Vec<std::net::IpAddr>,
}

#[derive(Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct FrontendReport {
    pub cluster_ip: std::net::IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    /// sessionAffinity ClientIP's timeout (0: none).
    pub affinity_secs: u32,
    /// The backend set's id in `SERVICE_BACKENDS`.
    pub set: u32,
    pub backends: Vec<std::net::SocketAddr>,
}

fn protocol_name(number: u8) -> &'static str {
    match number {
        6 => "TCP",
        17 => "UDP",
        132 => "SCTP",
        _ => "other",
    }
}

pub fn report(network: &str) -> Result<ServicesReport> {
    let datapath = Datapath::new(network);
    let mut frontends = Vec::new();
    for (key, value) in datapath.service_frontends()? {
        let (cluster_ip, port, protocol) = frontend_of(&key);
        let backends = datapath
            .service_backends(&key)?
            .unwrap_or_default()
            .iter()
            .map(backend_address)
            .collect();
        frontends.push(FrontendReport {
            cluster_ip,
            port,
            protocol: protocol_name(protocol),
            affinity_secs: value.affinity_secs,
            set: value.id,
            backends,
        });
    }
    frontends.sort();
    let mut nodeport_addresses = datapath.nodeport_addresses()?;
    nodeport_addresses.sort();
    Ok(ServicesReport {
        network: network.to_string(),
        attached: datapath.services_attached(),
        frontends,
        nodeport_addresses,
    })
}

/// The human form: one line per frontend.
pub fn render(report: &ServicesReport) -> String {
    let mut out = format!(
        "network {}: Service socket programs {}; {} frontend(s)\n",
        report.network,
        if report.attached {
            "attached"
        } else {
            "not attached"
        },
        report.frontends.len()
    );
    if !report.nodeport_addresses.is_empty() {
        let addresses: Vec<String> = report
            .nodeport_addresses
            .iter()
            .map(ToString::to_string)
            .collect();
        out.push_str(&format!(
            "  NodePorts (0.0.0.0 / [::] below) answer on {}\n",
            addresses.join(", ")
        ));
    }
    for f in &report.frontends {
        let backends: Vec<String> = f.backends.iter().map(ToString::to_string).collect();
        let target = if backends.is_empty() {
            "no endpoints: connect() refused".to_string()
        } else {
            backends.join(", ")
        };
        let affinity = if f.affinity_secs > 0 {
            format!(" (affinity {} s)", f.affinity_secs)
        } else {
            String::new()
        };
        let frontend = std::net::SocketAddr::new(f.cluster_ip, f.port);
        out.push_str(&format!(
            "  {frontend}/{}{affinity} -> {target}\n",
            f.protocol
        ));
    }
    out
}

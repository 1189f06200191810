//! `flatnet inspect --services`: the Service frontends a network's socket
//! programs balance (`--services ebpf`), each with its backends and who
//! outside the node reaches it, whether the programs are attached, and the
//! flows from outside the uplink program translated.

use serde::Serialize;

use crate::error::Result;
use flatnet_common::FRONTEND_F_HOST_PORT;
use flatnet_datapath::bpf::{Datapath, Outside, backend_address, frontend_of, protocol_name};

#[derive(Debug, Serialize)]
pub struct ServicesReport {
    pub network: String,
    /// The socket programs attached through their pinned links.
    pub attached: bool,
    pub frontends: Vec<FrontendReport>,
    /// The node addresses NodePorts answer on (a NodePort's frontend has
    /// the unspecified address: "any of these").
    pub nodeport_addresses: Vec<std::net::IpAddr>,
    /// Flows from outside the node the uplink program translated.
    pub translated_flows: Vec<FlowReport>,
}

/// One translated flow: the client, the frontend it asked for, its
/// backend, and the node port its source became (None: kept).
#[derive(Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlowReport {
    pub protocol: &'static str,
    pub client: std::net::SocketAddr,
    pub frontend: std::net::SocketAddr,
    pub backend: std::net::SocketAddr,
    pub nat_port: Option<u16>,
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
    /// Clients outside the node: "no", "cluster" (all backends, source
    /// translated) or "local" (this node's first `local_backends`).
    pub outside: &'static str,
    pub local_backends: u16,
    pub backends: Vec<std::net::SocketAddr>,
    /// A Pod's hostPort (the CNI plugin's frontend): its host veth.
    pub host_port_of: Option<String>,
}

pub fn report(network: &str) -> Result<ServicesReport> {
    let datapath = Datapath::new(network);
    let mut frontends = Vec::new();
    let host_ports = datapath.host_ports();
    for (key, value) in datapath.service_frontends()? {
        let (cluster_ip, port, protocol) = frontend_of(&key);
        let backends = datapath
            .service_backends(&key)?
            .unwrap_or_default()
            .iter()
            .map(backend_address)
            .collect();
        let host_port_of = (value.flags & FRONTEND_F_HOST_PORT != 0).then(|| {
            host_ports
                .iter()
                .find(|(_, ports)| {
                    ports
                        .iter()
                        .any(|p| (p.address, p.port, p.protocol) == (cluster_ip, port, protocol))
                })
                .map_or_else(|| "unrecorded".to_string(), |(veth, _)| veth.clone())
        });
        frontends.push(FrontendReport {
            host_port_of,
            cluster_ip,
            port,
            protocol: protocol_name(protocol),
            affinity_secs: value.affinity_secs,
            set: value.id,
            outside: match Outside::of(&value) {
                Outside::No => "no",
                Outside::Cluster => "cluster",
                Outside::Local(_) => "local",
            },
            local_backends: match Outside::of(&value) {
                Outside::Local(n) => n,
                _ => 0,
            },
            backends,
        });
    }
    frontends.sort();
    let mut nodeport_addresses = datapath.nodeport_addresses()?;
    nodeport_addresses.sort();
    let mut translated_flows: Vec<FlowReport> = datapath
        .nat_flows()?
        .iter()
        .map(|flow| FlowReport {
            protocol: protocol_name(flow.protocol),
            client: flow.client,
            frontend: flow.frontend,
            backend: flow.backend,
            nat_port: flow.nat_port,
        })
        .collect();
    translated_flows.sort();
    Ok(ServicesReport {
        network: network.to_string(),
        attached: datapath.services_attached(),
        frontends,
        nodeport_addresses,
        translated_flows,
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
        let outside = match (&f.host_port_of, f.outside) {
            (Some(veth), _) => format!(" [hostPort of {veth}, client kept]"),
            (None, outside) => match outside {
                "cluster" => " [outside clients: all, source translated]".to_string(),
                "local" => format!(" [outside clients: the first {} (local)]", f.local_backends),
                _ => String::new(),
            },
        };
        let frontend = std::net::SocketAddr::new(f.cluster_ip, f.port);
        out.push_str(&format!(
            "  {frontend}/{}{affinity}{outside} -> {target}\n",
            f.protocol
        ));
    }
    out.push_str(&format!(
        "  {} flow(s) from outside translated\n",
        report.translated_flows.len()
    ));
    for flow in &report.translated_flows {
        let nat = flow
            .nat_port
            .map_or_else(|| "client kept".to_string(), |p| format!("node port {p}"));
        out.push_str(&format!(
            "    {} {} -> {} -> {} ({nat})\n",
            flow.protocol, flow.client, flow.frontend, flow.backend
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_human_form_says_who_outside_reaches_a_frontend_and_lists_translated_flows() {
        let report = ServicesReport {
            network: "pods".into(),
            attached: true,
            frontends: vec![
                FrontendReport {
                    cluster_ip: "0.0.0.0".parse().unwrap(),
                    port: 30080,
                    protocol: "TCP",
                    affinity_secs: 0,
                    set: 3,
                    outside: "local",
                    local_backends: 1,
                    backends: vec!["10.244.0.5:8080".parse().unwrap()],
                    host_port_of: None,
                },
                FrontendReport {
                    cluster_ip: "127.0.0.1".parse().unwrap(),
                    port: 8443,
                    protocol: "TCP",
                    affinity_secs: 0,
                    set: 0x8000_0007,
                    outside: "local",
                    local_backends: 1,
                    backends: vec!["10.244.0.6:443".parse().unwrap()],
                    host_port_of: Some("fl0a1b2c3d".into()),
                },
            ],
            nodeport_addresses: vec!["172.30.0.1".parse().unwrap()],
            translated_flows: vec![FlowReport {
                protocol: "TCP",
                client: "172.30.0.100:40000".parse().unwrap(),
                frontend: "172.30.0.1:30080".parse().unwrap(),
                backend: "10.244.0.5:8080".parse().unwrap(),
                nat_port: None,
            }],
        };
        let text = render(&report);
        assert!(
            text.contains(
                "0.0.0.0:30080/TCP [outside clients: the first 1 (local)] -> 10.244.0.5:8080"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "127.0.0.1:8443/TCP [hostPort of fl0a1b2c3d, client kept] -> 10.244.0.6:443"
            ),
            "{text}"
        );
        assert!(text.contains("1 flow(s) from outside translated"), "{text}");
        assert!(
            text.contains(
                "TCP 172.30.0.100:40000 -> 172.30.0.1:30080 -> 10.244.0.5:8080 (client kept)"
            ),
            "{text}"
        );
    }
}

//! `flatnet inspect`'s view of other nodes: the remote pod CIDRs the fast
//! path knows, each with its carrier, and the VXLAN device it encapsulates
//! into.

use std::net::IpAddr;

use serde::Serialize;

use crate::error::Result;
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::netlink::{Netlink, format_mac};

#[derive(Debug, Serialize)]
pub struct RemoteReport {
    pub cidr: String,
    /// The node's address: the next hop (`direct`) or the tunnel's far end.
    pub node: IpAddr,
    /// `direct` or `vxlan`.
    pub carrier: &'static str,
}

#[derive(Debug, Serialize)]
pub struct TunnelReport {
    pub ifindex: u32,
    pub device: Option<String>,
    pub vni: u32,
    pub mac: String,
}

/// The remote CIDRs, sorted, and the tunnel (None without a device, or
/// with an older build's pins, which have no `TUNNEL` map).
pub async fn report(
    datapath: &Datapath,
    host: &Netlink,
) -> Result<(Vec<RemoteReport>, Option<TunnelReport>)> {
    let mut remote: Vec<RemoteReport> = datapath
        .remote_cidrs()?
        .into_iter()
        .map(|entry| RemoteReport {
            cidr: entry.cidr.to_string(),
            node: entry.node,
            carrier: if entry.tunnelled { "vxlan" } else { "direct" },
        })
        .collect();
    remote.sort_by(|a, b| a.cidr.cmp(&b.cidr));
    let tunnel = match datapath.tunnel() {
        Ok(Some(tunnel)) => Some(TunnelReport {
            ifindex: tunnel.ifindex,
            device: host.link_by_index(tunnel.ifindex).await?.map(|l| l.name),
            vni: tunnel.vni,
            mac: format_mac(&tunnel.mac),
        }),
        _ => None,
    };
    Ok((remote, tunnel))
}

/// The human form: one line for the tunnel, one per remote CIDR.
pub fn render(remote: &[RemoteReport], tunnel: Option<&TunnelReport>) -> String {
    let mut out = String::new();
    if let Some(tunnel) = tunnel {
        out.push_str(&format!(
            "  tunnel:   {} (ifindex {}), VNI {}, MAC {}\n",
            tunnel.device.as_deref().unwrap_or("(gone)"),
            tunnel.ifindex,
            tunnel.vni,
            tunnel.mac
        ));
    }
    for entry in remote {
        let how = match entry.carrier {
            "vxlan" => "through the tunnel to",
            _ => "via",
        };
        out.push_str(&format!(
            "  remote:   {} {how} {}\n",
            entry.cidr, entry.node
        ));
    }
    out
}

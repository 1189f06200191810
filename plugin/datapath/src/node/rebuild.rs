//! Rebuilding a network's datapath from what exists on the host, for when
//! its pinned state was wiped (bpffs remounted) while pods kept running:
//! the next ADD does it, and so does `flatnet repair`.
//!
//! Everything needed is in the kernel's own tables: the gateway device
//! (marked `flatnet:<network>`) gives the subnets; each pod has a host route
//! (/32, /128) into one of them via its host veth, and a permanent neighbour
//! entry there with its MAC; its qdiscs say what the bandwidth plugin shapes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use flatnet_common::{ENDPOINT_F_NONE, Endpoint};
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::AddressFamily;

use crate::DatapathMode;
use crate::bpf::attach_host_veth;
use crate::bpf::{Datapath, Shaping};
use crate::error::Result;
use crate::netlink::{Netlink, gateway_alias};

/// Re-inserts every pod of `network` found on the host into the (freshly
/// loaded) datapath and attaches it to their veths; returns how many.
pub async fn rebuild_pods(
    network: &str,
    gateway_device: &str,
    mode: DatapathMode,
    datapath: &Datapath,
    host: &Netlink,
) -> Result<usize> {
    let Some(gateway) = host.link_by_name(gateway_device).await? else {
        return Ok(0);
    };
    if gateway.alias.as_deref() != Some(gateway_alias(network).as_str()) {
        return Ok(0);
    }
    let subnets: Vec<IpNetwork> = host
        .addresses(gateway.index)
        .await?
        .into_iter()
        .map(crate::util::normalized)
        .collect();
    let mut pods: BTreeMap<u32, Vec<IpAddr>> = BTreeMap::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        for route in host.routes(family).await? {
            let host_route = route.dst.prefix() == if route.dst.is_ipv4() { 32 } else { 128 };
            if let Some(oif) = route.oif
                && host_route
                && oif != gateway.index
                && subnets.iter().any(|net| net.contains(route.dst.ip()))
            {
                pods.entry(oif).or_default().push(route.dst.ip());
            }
        }
    }
    let mut restored = 0;
    for (index, addresses) in pods {
        let Some(veth) = host.link_by_index(index).await? else {
            continue;
        };
        let neighbours = host.neighbours(index).await?;
        let pod_mac = addresses.iter().find_map(|ip| {
            neighbours
                .iter()
                .find(|(n, _)| n == ip)
                .map(|(_, mac)| *mac)
        });
        let (Some(pod_mac), Some(host_mac)) = (pod_mac, veth.mac) else {
            eprintln!(
                "flatnet: repair: no MAC known for the pod behind {}; skipped",
                veth.name
            );
            continue;
        };
        let counter_slot = datapath.claim_counter_slot(index)?;
        let endpoint = Endpoint {
            host_ifindex: index,
            flags: ENDPOINT_F_NONE,
            pod_mac,
            host_mac,
            counter_slot,
        };
        let shaping = shaping_on(host, index).await?;
        datapath.insert_pod(endpoint, &addresses, shaping)?;
        attach_host_veth(datapath, mode, host, index, &veth.name).await?;
        restored += 1;
    }
    Ok(restored)
}

/// What the bandwidth plugin shapes on host veth `index`, read back from its
/// qdiscs: a `tbf` at the root shapes what goes into the pod, an `ingress`
/// qdisc (redirecting to an ifb device) what comes out of it.
async fn shaping_on(host: &Netlink, index: u32) -> Result<Shaping> {
    /// TC_H_ROOT from linux/pkt_sched.h.
    const ROOT: u32 = 0xffff_ffff;
    let qdiscs = host.qdiscs(index).await?;
    Ok(Shaping {
        ingress: qdiscs
            .iter()
            .any(|(parent, kind)| *parent == ROOT && kind == "tbf"),
        egress: qdiscs.iter().any(|(_, kind)| kind == "ingress"),
    })
}

//! Rebuilding a network's datapath from what exists on the host, for when
//! its pinned state was wiped (bpffs remounted) while pods kept running:
//! the next ADD does it, and so does `flatnet repair`.
//!
//! Everything needed is in the kernel's own tables: the gateway device
//! (marked `flatnet:<network>`) gives the subnets; each pod has a host route
//! (/32, /128) into one of them via its host veth, and a permanent neighbour
//! entry there with its MAC.

use std::collections::BTreeMap;
use std::net::IpAddr;

use flatnet_common::{ENDPOINT_F_NONE, Endpoint};
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::AddressFamily;

use super::attach_host_veth;
use crate::cni::config::{DatapathMode, NetConf};
use crate::cni::error::{Error, Result};
use crate::datapath::Datapath;
use crate::link::{Netlink, gateway_alias};
use crate::lock::{self, Lock};

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
        datapath.insert_pod(endpoint, &addresses)?;
        attach_host_veth(datapath, mode, host, index, counter_slot).await?;
        restored += 1;
    }
    Ok(restored)
}

/// Makes sure this build's programs for the configured mode are pinned and
/// returns the network lock to hold for the rest of the ADD: shared when
/// they already were (the common case: no verifier run per pod), exclusive
/// when this ADD loaded them. Loading over an older build moves every
/// existing pod's veth onto the new programs, atomically per veth.
pub async fn ensure_datapath(conf: &NetConf, datapath: &Datapath, host: &Netlink) -> Result<Lock> {
    let lock_name = lock::network(&conf.name);
    let shared = Lock::shared(&lock_name)?;
    if datapath.is_loaded(conf.datapath) {
        return Ok(shared);
    }
    drop(shared);
    let exclusive = Lock::exclusive(&lock_name)?;
    if datapath.is_loaded(conf.datapath) {
        return Ok(exclusive);
    }
    if let Some(pinned) = datapath.pinned_mode()
        && pinned != conf.datapath
        && datapath.pod_count()? > 0
    {
        return Err(Error::config(format!(
            "network {} runs the {} datapath with pods attached; \"datapath\": \"{}\" needs them deleted first",
            conf.name,
            pinned.as_str(),
            conf.datapath.as_str()
        )));
    }
    datapath.load(conf.datapath)?;
    if datapath.pod_count()? == 0 {
        // Empty maps: a new network, or pins wiped under running pods.
        rebuild_pods(
            &conf.name,
            &conf.gateway_device,
            conf.datapath,
            datapath,
            host,
        )
        .await?;
    } else {
        for (index, _) in datapath.host_veths()? {
            if host.link_by_index(index).await?.is_some() {
                let counter_slot = datapath.ensure_counter_slot(index)?;
                attach_host_veth(datapath, conf.datapath, host, index, counter_slot).await?;
            }
        }
    }
    datapath.retire_other_programs(conf.datapath)?;
    Ok(exclusive)
}

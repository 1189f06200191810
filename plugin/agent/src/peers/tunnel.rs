//! What tunnelled routes need besides the route: the VXLAN device's index
//! and VNI, the encapsulation attributes, and the next hops' permanent
//! neighbour entries (written with each route, pruned when their peer
//! leaves).

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAttribute, RouteIp6Tunnel, RouteIp6TunnelFlags, RouteIpTunnel, RouteIpTunnelFlags,
    RouteLwEnCapType, RouteLwTunnelEncap,
};

use rtnetlink::Handle;

use crate::error::{AgentError, Result};
use crate::peers::carrier::{vtep_mac, vxlan_gateway};
use crate::peers::{Carrier, PeerRoute, SyncOutcome};

/// The VXLAN device tunnelled routes go through, and their VNI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    pub index: u32,
    pub vni: u32,
}

/// The permanent neighbour entry of `route`'s next hop on the device:
/// the peer device's MAC. Returns the next hop.
pub(super) async fn write_next_hop(
    handle: &Handle,
    route: &PeerRoute,
    tunnel: Tunnel,
) -> Result<IpAddr, rtnetlink::Error> {
    let next_hop = vxlan_gateway(route.cidr);
    handle
        .neighbours()
        .add(tunnel.index, next_hop)
        .link_layer_address(&vtep_mac(route.via))
        .replace()
        .execute()
        .await?;
    Ok(next_hop)
}

/// Makes the device's permanent neighbour entries exactly the next
/// hops of the tunnelled routes in place, from one listing: a missing
/// or wrong one is written (the kernel flushes a device's neighbours,
/// permanent ones too, when its MAC changes, as when this node's
/// address did), one no route uses is removed (its peer left or is
/// routed directly now). A next hop that cannot be written makes its
/// route missing.
pub(super) async fn sync_next_hops(handle: &Handle, outcome: &mut SyncOutcome, tunnel: Tunnel) {
    let present = match next_hops(handle, tunnel).await {
        Ok(present) => present,
        Err(e) => {
            outcome.failures.push(e.to_string());
            return;
        }
    };
    let mut kept = BTreeSet::new();
    let mut failed = Vec::new();
    // By address: a lookup per route (5,000 peers made a scan of every
    // entry per route 25 million comparisons at each re-check).
    let macs: HashMap<IpAddr, &[u8]> = present
        .iter()
        .map(|(ip, mac, _)| (*ip, mac.as_slice()))
        .collect();
    for route in outcome
        .in_place
        .iter()
        .filter(|r| r.carrier == Carrier::Vxlan)
    {
        let next_hop = vxlan_gateway(route.cidr);
        kept.insert(next_hop);
        let right = macs
            .get(&next_hop)
            .is_some_and(|mac| *mac == vtep_mac(route.via));
        if !right && let Err(e) = write_next_hop(handle, route, tunnel).await {
            failed.push((
                route.cidr,
                AgentError::route(format!("{}: its next hop", route.cidr), e),
            ));
        }
    }
    for (cidr, error) in failed {
        outcome.in_place.retain(|r| r.cidr != cidr);
        outcome.missing.push(error.to_string());
        outcome.failures.push(error.to_string());
    }
    for (ip, _, entry) in present {
        if kept.contains(&ip) {
            continue;
        }
        match handle.neighbours().del(entry).execute().await {
            Ok(()) => tracing::info!(next_hop = %ip, "stale tunnel next hop removed"),
            Err(e) => outcome.failures.push(
                AgentError::route(format!("removing the tunnel next hop {ip}"), e).to_string(),
            ),
        }
    }
}

/// The device's permanent neighbour entries: (address, MAC, entry).
async fn next_hops(
    handle: &Handle,
    tunnel: Tunnel,
) -> Result<Vec<(IpAddr, Vec<u8>, NeighbourMessage)>> {
    let mut found = Vec::new();
    let mut entries = handle.neighbours().get().execute();
    while let Some(entry) = entries
        .try_next()
        .await
        .map_err(|e| AgentError::route("listing neighbours".into(), e))?
    {
        if entry.header.ifindex != tunnel.index || entry.header.state != NeighbourState::Permanent {
            continue;
        }
        let mac = entry.attributes.iter().find_map(|attr| match attr {
            NeighbourAttribute::LinkLayerAddress(mac) => Some(mac.clone()),
            _ => None,
        });
        if let (Some(ip), Some(mac)) = (destination(&entry), mac) {
            found.push((ip, mac, entry));
        }
    }
    Ok(found)
}

/// The address a neighbour entry is for.
fn destination(entry: &NeighbourMessage) -> Option<IpAddr> {
    entry.attributes.iter().find_map(|attr| match attr {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

/// The attributes that make a route encapsulate to `peer` with `vni`
/// (`encap ip id VNI dst PEER`; `ip6 ... csum` for an IPv6 underlay: a
/// zero UDP checksum over IPv6 is dropped by the receiving device, RFC
/// 6935, as the datapath's tunnel key also asks for one).
pub(super) fn encap(peer: IpAddr, vni: u32) -> [RouteAttribute; 2] {
    let id = u64::from(vni);
    match peer {
        IpAddr::V4(v4) => [
            RouteAttribute::EncapType(RouteLwEnCapType::Ip),
            RouteAttribute::Encap(vec![
                RouteLwTunnelEncap::Ip(RouteIpTunnel::Id(id)),
                RouteLwTunnelEncap::Ip(RouteIpTunnel::Destination(v4)),
                RouteLwTunnelEncap::Ip(RouteIpTunnel::Flags(RouteIpTunnelFlags::Key)),
            ]),
        ],
        IpAddr::V6(v6) => [
            RouteAttribute::EncapType(RouteLwEnCapType::Ip6),
            RouteAttribute::Encap(vec![
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Id(id)),
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Destination(v6)),
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Flags(
                    RouteIp6TunnelFlags::Key | RouteIp6TunnelFlags::Checksum,
                )),
            ]),
        ],
    }
}

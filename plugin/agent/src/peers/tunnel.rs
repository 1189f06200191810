//! What tunnelled routes need besides the route: the VXLAN device's index
//! and VNI, the encapsulation attributes, and the next hops' permanent
//! neighbour entries (written with each route, pruned when their peer
//! leaves).

use std::collections::BTreeSet;
use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAttribute, RouteIp6Tunnel, RouteIp6TunnelFlags, RouteIpTunnel, RouteIpTunnelFlags,
    RouteLwEnCapType, RouteLwTunnelEncap,
};

use crate::peers::carrier::{vtep_mac, vxlan_gateway};
use crate::peers::routes::Routes;
use crate::peers::{Carrier, PeerRoute};

/// The VXLAN device tunnelled routes go through, and their VNI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    pub index: u32,
    pub vni: u32,
}

impl Routes {
    /// The permanent neighbour entry of `route`'s next hop on the device:
    /// the peer device's MAC. Returns the next hop.
    pub(super) async fn write_next_hop(
        &self,
        route: &PeerRoute,
        tunnel: Tunnel,
    ) -> Result<IpAddr, rtnetlink::Error> {
        let next_hop = vxlan_gateway(route.cidr);
        self.handle
            .neighbours()
            .add(tunnel.index, next_hop)
            .link_layer_address(&vtep_mac(route.via))
            .replace()
            .execute()
            .await?;
        Ok(next_hop)
    }

    /// Removes the device's permanent neighbour entries that no tunnelled
    /// route of `wanted` uses (their peer left or is routed directly now).
    pub(super) async fn prune_next_hops(
        &self,
        wanted: &[PeerRoute],
        tunnel: Tunnel,
    ) -> crate::error::Result<()> {
        let used: BTreeSet<IpAddr> = wanted
            .iter()
            .filter(|r| r.carrier == Carrier::Vxlan)
            .map(|r| vxlan_gateway(r.cidr))
            .collect();
        let mut stale: Vec<NeighbourMessage> = Vec::new();
        let mut entries = self.handle.neighbours().get().execute();
        while let Some(entry) = entries
            .try_next()
            .await
            .map_err(|e| super::routes::route_err("listing neighbours".into(), e))?
        {
            let ours = entry.header.ifindex == tunnel.index
                && entry.header.state == NeighbourState::Permanent;
            if ours && destination(&entry).is_some_and(|ip| !used.contains(&ip)) {
                stale.push(entry);
            }
        }
        for entry in stale {
            let ip = destination(&entry);
            match self.handle.neighbours().del(entry).execute().await {
                Ok(()) => tracing::info!(next_hop = ?ip, "stale tunnel next hop removed"),
                Err(e) => {
                    return Err(super::routes::route_err(
                        format!("removing the tunnel next hop {ip:?}"),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }
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
/// (`encap ip id VNI dst PEER`; `ip6` for an IPv6 underlay).
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
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Flags(RouteIp6TunnelFlags::Key)),
            ]),
        ],
    }
}

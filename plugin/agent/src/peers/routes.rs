//! Peer routes: one per peer node's pod CIDR, in the main table. Each is
//! tagged with flatnet's own route protocol number so the agent finds its
//! routes again after a restart (and removes the stale ones) without any
//! state of its own. host-gw (`Carrier::Direct`): via the peer's address.
//! VXLAN: via the CIDR's network address on the VXLAN device (onlink, a
//! permanent neighbour entry with the peer device's MAC), encapsulated to
//! the peer's address by the route itself (`encap ip id VNI dst PEER`).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteIp6Tunnel, RouteIpTunnel, RouteLwTunnelEncap, RouteMessage,
    RouteProtocol, RouteVia,
};
use rtnetlink::{Handle, RouteMessageBuilder};

use crate::error::{AgentError, Result};
use crate::peers::carrier::vxlan_gateway;
use crate::peers::tunnel::{Tunnel, encap, sync_next_hops, write_next_hop};
use crate::peers::{Carrier, PeerRoute, SyncOutcome};
use flatnet_datapath::netlink::errno;

/// The route protocol flatnet's routes carry: `ip route show proto 102`.
/// (Numbers up to 99 and the routing daemons' 186..=192 are taken in
/// iproute2's rt_protos; 102 is not.)
pub const RTPROT_FLATNET: u8 = 102;
const MAIN_TABLE: u8 = 254;

/// A route of the main table, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledRoute {
    pub cidr: IpNetwork,
    pub via: Option<IpAddr>,
    pub protocol: u8,
    /// Its output interface, when it names one.
    pub oif: Option<u32>,
    /// Where it encapsulates to (an IP tunnel route's `dst`).
    pub encap_dst: Option<IpAddr>,
}

impl InstalledRoute {
    /// True when this is `wanted` as `write` makes it (through `tunnel`).
    fn is(&self, wanted: &PeerRoute, tunnel: Option<Tunnel>) -> bool {
        match wanted.carrier {
            Carrier::Direct => self.via == Some(wanted.via) && self.encap_dst.is_none(),
            Carrier::Vxlan => {
                self.encap_dst == Some(wanted.via)
                    && self.via == Some(vxlan_gateway(wanted.cidr))
                    && tunnel.is_some_and(|t| self.oif == Some(t.index))
            }
        }
    }
}

/// An rtnetlink connection for the node's routes.
pub struct Routes {
    handle: Handle,
}

impl Routes {
    /// Connects in the calling thread's network namespace (the node's).
    pub fn connect() -> Result<Self> {
        let (connection, handle, _) = rtnetlink::new_connection()
            .map_err(|e| AgentError::io("opening a netlink socket", e))?;
        tokio::spawn(connection);
        Ok(Routes { handle })
    }

    /// Every main-table route of both families.
    pub async fn main_table(&self) -> Result<Vec<InstalledRoute>> {
        let mut found = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessage::default();
            query.header.address_family = family;
            let mut stream = self.handle.route().get(query).execute();
            while let Some(msg) = stream
                .try_next()
                .await
                .map_err(|e| AgentError::route("listing routes".into(), e))?
            {
                if msg.header.table != MAIN_TABLE {
                    continue;
                }
                if let Some(route) = installed(&msg, family) {
                    found.push(route);
                }
            }
        }
        Ok(found)
    }

    /// flatnet's routes (by their protocol number).
    pub async fn ours(&self) -> Result<Vec<InstalledRoute>> {
        Ok(self
            .main_table()
            .await?
            .into_iter()
            .filter(|r| r.protocol == RTPROT_FLATNET)
            .collect())
    }

    /// Adds or replaces the route of `route.cidr` via `route.via`, or, for
    /// VXLAN, through `tunnel` to it (its next hop's neighbour entry first).
    pub async fn write(&self, route: &PeerRoute, tunnel: Option<Tunnel>) -> Result<()> {
        let context = || {
            format!(
                "routing {} via {} ({:?}, node {})",
                route.cidr, route.via, route.carrier, route.node
            )
        };
        let route_error = |reason: String| AgentError::Route {
            context: context(),
            reason,
        };
        let builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(route.cidr.network(), route.cidr.prefix())
            .map_err(|e| route_error(e.to_string()))?
            .protocol(RouteProtocol::from(RTPROT_FLATNET));
        let message = match route.carrier {
            Carrier::Direct => builder
                .gateway(route.via)
                .map_err(|e| route_error(e.to_string()))?
                .build(),
            Carrier::Vxlan => {
                let tunnel =
                    tunnel.ok_or_else(|| route_error("the VXLAN device is not set up".into()))?;
                let next_hop = write_next_hop(&self.handle, route, tunnel)
                    .await
                    .map_err(|e| AgentError::route(format!("{}: its next hop", context()), e))?;
                let mut message = builder
                    .gateway(next_hop)
                    .map_err(|e| route_error(e.to_string()))?
                    .output_interface(tunnel.index)
                    .onlink()
                    .build();
                message.attributes.extend(encap(route.via, tunnel.vni));
                message
            }
        };
        self.handle
            .route()
            .add(message)
            .replace()
            .execute()
            .await
            .map_err(|e| AgentError::route(context(), e))
    }

    /// Removes one of flatnet's routes; one already gone is fine.
    pub async fn remove(&self, route: &InstalledRoute) -> Result<()> {
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(route.cidr.network(), route.cidr.prefix())
            .map_err(|e| AgentError::Route {
                context: format!("removing the route of {}", route.cidr),
                reason: e.to_string(),
            })?;
        if let Some(via) = route.via {
            builder = builder.gateway(via).map_err(|e| AgentError::Route {
                context: format!("removing the route of {}", route.cidr),
                reason: e.to_string(),
            })?;
        }
        let message = builder
            .protocol(RouteProtocol::from(route.protocol))
            .build();
        match self.handle.route().del(message).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(libc::ESRCH) | Some(libc::ENOENT)) => Ok(()),
            Err(e) => Err(AgentError::route(
                format!("removing the route of {}", route.cidr),
                e,
            )),
        }
    }

    /// Makes flatnet's routes exactly `wanted`: writes the missing and
    /// changed ones first, then removes the ones no longer wanted. A CIDR
    /// that some other route (not flatnet's) already covers exactly is left
    /// alone: the node's administrator put it there. `wanted` comes from
    /// [`crate::peers::plan`], CIDRs normalized, as the kernel lists them.
    pub async fn sync(&self, wanted: &[PeerRoute], tunnel: Option<Tunnel>) -> Result<SyncOutcome> {
        let table = self.main_table().await?;
        // By destination: a lookup per wanted route, not a scan of the table.
        let mut by_cidr: HashMap<IpNetwork, Vec<&InstalledRoute>> = HashMap::new();
        for installed in &table {
            by_cidr.entry(installed.cidr).or_default().push(installed);
        }
        let mut outcome = SyncOutcome::default();
        for route in wanted {
            let cidr = route.cidr;
            let existing = by_cidr.get(&cidr).map_or(&[][..], Vec::as_slice);
            if let Some(foreign) = existing.iter().find(|r| r.protocol != RTPROT_FLATNET) {
                outcome.missing.push(format!(
                    "{cidr} (node {}): a route not made by flatnet (protocol {}) is in the way",
                    route.node, foreign.protocol
                ));
                continue;
            }
            if existing.iter().any(|r| r.is(route, tunnel)) {
                outcome.in_place.push(route.clone());
                continue;
            }
            match self.write(route, tunnel).await {
                Ok(()) => {
                    outcome.written.push(cidr);
                    outcome.in_place.push(route.clone());
                }
                Err(e) => {
                    outcome.missing.push(e.to_string());
                    outcome.failures.push(e.to_string());
                }
            }
        }
        let wanted_cidrs: HashSet<IpNetwork> = wanted.iter().map(|w| w.cidr).collect();
        for stale in table.iter().filter(|r| r.protocol == RTPROT_FLATNET) {
            if wanted_cidrs.contains(&stale.cidr) {
                continue;
            }
            match self.remove(stale).await {
                Ok(()) => outcome.removed.push(stale.cidr),
                Err(e) => outcome.failures.push(e.to_string()),
            }
        }
        if let Some(tunnel) = tunnel {
            sync_next_hops(&self.handle, &mut outcome, tunnel).await;
        }
        Ok(outcome)
    }

    /// The subnets of this node's addresses (global scope, both families):
    /// the peers `--routing auto` reaches without a tunnel.
    pub async fn connected_subnets(&self) -> Result<Vec<IpNetwork>> {
        let mut subnets = Vec::new();
        let mut stream = self.handle.address().get().execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| AgentError::route("listing addresses".into(), e))?
        {
            for attr in &msg.attributes {
                let AddressAttribute::Address(ip) = attr else {
                    continue;
                };
                let local = match ip {
                    IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local(),
                    IpAddr::V6(v6) => v6.is_loopback() || v6.is_unicast_link_local(),
                };
                if !local && let Ok(subnet) = IpNetwork::new(*ip, msg.header.prefix_len) {
                    subnets.push(subnet);
                }
            }
        }
        Ok(subnets)
    }

    /// The index of the interface that holds `address` (the node's uplink).
    pub async fn interface_with(&self, address: IpAddr) -> Result<Option<u32>> {
        let mut stream = self.handle.address().get().execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| AgentError::route("listing addresses".into(), e))?
        {
            let holds = msg
                .attributes
                .iter()
                .any(|a| matches!(a, AddressAttribute::Address(ip) if *ip == address));
            if holds {
                return Ok(Some(msg.header.index));
            }
        }
        Ok(None)
    }
}

/// A route message as an `InstalledRoute`; None for routes without a
/// destination flatnet could own (e.g. multipath without a gateway).
fn installed(msg: &RouteMessage, family: AddressFamily) -> Option<InstalledRoute> {
    let mut dst = None;
    let mut via = None;
    let mut oif = None;
    let mut encap_dst = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Encap(items) => {
                for item in items {
                    match item {
                        RouteLwTunnelEncap::Ip(RouteIpTunnel::Destination(v4)) => {
                            encap_dst = Some(IpAddr::V4(*v4));
                        }
                        RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Destination(v6)) => {
                            encap_dst = Some(IpAddr::V6(*v6));
                        }
                        _ => {}
                    }
                }
            }
            RouteAttribute::Destination(addr) => dst = route_ip(addr),
            RouteAttribute::Gateway(addr) => via = route_ip(addr),
            RouteAttribute::Via(RouteVia::Inet6(v6)) => via = Some(IpAddr::V6(*v6)),
            RouteAttribute::Via(RouteVia::Inet(v4)) => via = Some(IpAddr::V4(*v4)),
            _ => {}
        }
    }
    let dst = dst.unwrap_or(if family == AddressFamily::Inet6 {
        IpAddr::from([0u16; 8])
    } else {
        IpAddr::from([0u8; 4])
    });
    let cidr = IpNetwork::new(dst, msg.header.destination_prefix_length).ok()?;
    Some(InstalledRoute {
        cidr,
        via,
        protocol: u8::from(msg.header.protocol),
        oif,
        encap_dst,
    })
}

fn route_ip(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

//! Routes of the main table.

use futures::TryStreamExt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};

use super::{EEXIST, Netlink, errno, kernel};
use crate::error::{Error, Result};

/// A route as read back from the kernel (main table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteState {
    pub dst: IpNetwork,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
}

impl Netlink {
    /// Adds (or replaces) the route `dst [via gw] dev oif [src]`; `scope_link`
    /// for routes without a gateway.
    pub async fn add_route(
        &self,
        dst: IpNetwork,
        gateway: Option<IpAddr>,
        oif: u32,
        pref_src: Option<IpAddr>,
    ) -> Result<()> {
        let context = || {
            let via = gateway.map(|gw| format!(" via {gw}")).unwrap_or_default();
            format!("adding route {dst}{via} dev #{oif}")
        };
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.network(), dst.prefix())
            .map_err(|e| Error::kernel(context(), e))?
            .output_interface(oif);
        if let Some(gw) = gateway {
            builder = builder
                .gateway(gw)
                .map_err(|e| Error::kernel(context(), e))?;
        } else {
            builder = builder.scope(RouteScope::Link);
        }
        if let Some(src) = pref_src {
            builder = builder
                .pref_source(src)
                .map_err(|e| Error::kernel(context(), e))?;
        }
        // Replace: a route to this address left on a downed veth (an IPv6
        // route outlives "down" until the link is deleted after the answer) must give
        // way to the new pod's.
        match self
            .handle
            .route()
            .add(builder.build())
            .replace()
            .execute()
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(kernel(context(), e)),
        }
    }

    /// All main-table routes of one family.
    pub async fn routes(&self, family: AddressFamily) -> Result<Vec<RouteState>> {
        let mut query = RouteMessage::default();
        query.header.address_family = family;
        let mut stream = self.handle.route().get(query).execute();
        let mut found = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| kernel("listing routes", e))?
        {
            if msg.header.table != 254 {
                continue;
            }
            let mut dst_ip = None;
            let mut route = RouteState {
                dst: IpNetwork::new(IpAddr::from([0, 0, 0, 0]), 0)
                    .unwrap_or_else(|_| unreachable!()),
                gateway: None,
                oif: None,
            };
            for attr in &msg.attributes {
                match attr {
                    RouteAttribute::Destination(addr) => dst_ip = route_ip(addr),
                    RouteAttribute::Gateway(addr) => route.gateway = route_ip(addr),
                    RouteAttribute::Oif(index) => route.oif = Some(*index),
                    _ => {}
                }
            }
            let unspecified = if family == AddressFamily::Inet6 {
                IpAddr::from([0u16; 8])
            } else {
                IpAddr::from([0u8; 4])
            };
            if let Ok(dst) = IpNetwork::new(
                dst_ip.unwrap_or(unspecified),
                msg.header.destination_prefix_length,
            ) {
                route.dst = dst;
                found.push(route);
            }
        }
        Ok(found)
    }
}

fn route_ip(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

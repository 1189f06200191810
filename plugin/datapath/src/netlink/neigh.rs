//! Neighbour entries: the permanent ones flatnet writes for its pods.

use futures::TryStreamExt;
use std::net::IpAddr;

use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute};

use super::names::Mac;
use super::{Netlink, kernel};
use crate::error::Result;

impl Netlink {
    /// A permanent neighbour entry, so the host never ARPs for a pod.
    pub async fn add_permanent_neighbour(&self, index: u32, ip: IpAddr, mac: Mac) -> Result<()> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .map_err(|e| kernel(format!("adding neighbour {ip} on interface #{index}"), e))
    }

    /// The neighbour entries (address, MAC) on interface `index`.
    pub async fn neighbours(&self, index: u32) -> Result<Vec<(IpAddr, Mac)>> {
        let mut found = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut stream = self
                .handle
                .neighbours()
                .get()
                .set_address_family(family)
                .execute();
            while let Some(msg) = stream
                .try_next()
                .await
                .map_err(|e| kernel("listing neighbours", e))?
            {
                if msg.header.ifindex != index {
                    continue;
                }
                let mut ip = None;
                let mut mac = None;
                for attr in &msg.attributes {
                    match attr {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                            ip = Some(IpAddr::V4(*v4))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                            ip = Some(IpAddr::V6(*v6))
                        }
                        NeighbourAttribute::LinkLayerAddress(bytes) => {
                            mac = bytes.as_slice().try_into().ok()
                        }
                        _ => {}
                    }
                }
                if let (Some(ip), Some(mac)) = (ip, mac) {
                    found.push((ip, mac));
                }
            }
        }
        Ok(found)
    }
}

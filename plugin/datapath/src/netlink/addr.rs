//! Addresses of a link.

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};

use super::{EEXIST, Netlink, errno, kernel};
use crate::error::Result;

impl Netlink {
    /// Adds an address; one that is already there is not an error. IPv6
    /// addresses skip duplicate address detection: the address is ours (IPAM
    /// says so) and must be usable the moment ADD returns.
    pub async fn add_address(&self, index: u32, address: IpNetwork) -> Result<()> {
        let mut request = self
            .handle
            .address()
            .add(index, address.ip(), address.prefix());
        if address.is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match request.execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(kernel(
                format!("adding address {address} to interface #{index}"),
                e,
            )),
        }
    }

    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut found = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| kernel("listing addresses", e))?
        {
            for attr in &msg.attributes {
                if let AddressAttribute::Address(ip) = attr
                    && let Ok(net) = IpNetwork::new(*ip, msg.header.prefix_len)
                {
                    found.push(net);
                }
            }
        }
        Ok(found)
    }
}

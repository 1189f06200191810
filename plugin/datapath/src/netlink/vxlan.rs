//! The node's VXLAN device: external mode (collect_md), so one device
//! carries pod traffic to every peer, each route naming its peer
//! (`encap ip id VNI dst PEER`) instead of an FDB entry per peer.

use futures::TryStreamExt;
use rtnetlink::packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVxlan};

use super::names::Mac;
use super::{EEXIST, Netlink, errno, kernel};
use crate::error::{Error, Result};

/// What the device must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanDevice<'a> {
    pub name: &'a str,
    /// Its UDP port (`dstport`).
    pub port: u16,
    /// Its MAC: the inner frames' destination, derived from the node's
    /// address so peers know it without asking.
    pub mac: Mac,
    pub mtu: u32,
}

impl Netlink {
    /// Makes the device exist as `wanted` and up; returns its index. A
    /// device of that name that is not an external VXLAN device on
    /// `wanted.port` is replaced (a port cannot be changed in place).
    pub async fn ensure_vxlan_device(&self, wanted: &VxlanDevice<'_>) -> Result<u32> {
        let name = wanted.name;
        if let Some(link) = self.link_by_name(name).await?
            && self.vxlan_port(link.index).await? != Some(wanted.port)
        {
            self.delete_link(link.index).await?;
        }
        if self.link_by_name(name).await?.is_none() {
            let message = LinkMessageBuilder::<LinkVxlan>::new(name)
                .append_info_data(InfoVxlan::CollectMetadata(true))
                .port(wanted.port)
                .learning(false)
                .address(wanted.mac.to_vec())
                .mtu(wanted.mtu)
                .build();
            match self.handle.link().add(message).execute().await {
                Ok(()) => {}
                Err(e) if errno(&e) == Some(EEXIST) => {}
                Err(e) => return Err(kernel(format!("creating VXLAN device {name}"), e)),
            }
        }
        let link = self.link_by_name(name).await?.ok_or_else(|| {
            Error::kernel(
                format!("creating VXLAN device {name}"),
                "it vanished at once",
            )
        })?;
        if link.mac != Some(wanted.mac) || link.mtu != Some(wanted.mtu) {
            self.handle
                .link()
                .set(
                    LinkUnspec::new_with_index(link.index)
                        .address(wanted.mac.to_vec())
                        .mtu(wanted.mtu)
                        .build(),
                )
                .execute()
                .await
                .map_err(|e| kernel(format!("setting {name}'s MAC and MTU"), e))?;
        }
        if !link.up {
            self.set_up(link.index).await?;
        }
        Ok(link.index)
    }

    /// The UDP port of the external VXLAN device `index`; None when it is
    /// not one.
    async fn vxlan_port(&self, index: u32) -> Result<Option<u16>> {
        let mut request = self.handle.link().get().match_index(index).execute();
        let Some(msg) = request
            .try_next()
            .await
            .map_err(|e| kernel(format!("reading interface #{index}"), e))?
        else {
            return Ok(None);
        };
        let mut external = false;
        let mut port = None;
        for attr in &msg.attributes {
            let LinkAttribute::LinkInfo(infos) = attr else {
                continue;
            };
            for info in infos {
                let LinkInfo::Data(InfoData::Vxlan(data)) = info else {
                    continue;
                };
                for item in data {
                    match item {
                        InfoVxlan::CollectMetadata(on) => external = *on,
                        InfoVxlan::Port(p) => port = Some(*p),
                        _ => {}
                    }
                }
            }
        }
        Ok(port.filter(|_| external))
    }
}

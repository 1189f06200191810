//! The gateway device: a bridge without ports that holds a network's
//! gateway addresses, marked with an alias so flatnet knows it is its own.

use super::sysctl::set_sysctl;
use rtnetlink::{LinkBridge, LinkUnspec};

use super::{EEXIST, Netlink, errno, kernel};
use crate::error::{Error, Result};

const GATEWAY_ALIAS_PREFIX: &str = "flatnet:";

pub fn gateway_alias(network: &str) -> String {
    format!("{GATEWAY_ALIAS_PREFIX}{network}")
}

impl Netlink {
    /// Makes sure the gateway device `name` of `network` exists and is up;
    /// returns its index. It is a Linux bridge without ports (the dummy
    /// driver is not in every kernel): it only holds the gateway address, and
    /// no pod is ever attached to it. flatnet marks the devices it creates with the alias
    /// `flatnet:<network>` and refuses a device another network owns.
    pub async fn ensure_gateway_device(&self, name: &str, network: &str) -> Result<u32> {
        let owner = gateway_alias(network);
        if self.link_by_name(name).await?.is_none() {
            match self
                .handle
                .link()
                .add(
                    LinkBridge::new(name)
                        .multicast(false)
                        .mcast_snooping(false)
                        .build(),
                )
                .execute()
                .await
            {
                Ok(()) => {
                    // Created down and without multicast, so it never speaks: it
                    // only holds gateway addresses (no IPv6 autoconf, no IGMP reports
                    // for multicast snooping groups). Brought up below.
                    set_sysctl(&format!("net/ipv6/conf/{name}/disable_ipv6"), "1")?;
                    // The kernel ignores IFLA_IFALIAS when creating a link.
                    let index = self
                        .link_by_name(name)
                        .await?
                        .map(|link| link.index)
                        .unwrap_or_default();
                    self.handle
                        .link()
                        .set(
                            LinkUnspec::new_with_index(index)
                                .alias(owner.clone())
                                .build(),
                        )
                        .execute()
                        .await
                        .map_err(|e| {
                            kernel(format!("marking gateway device {name} as flatnet's"), e)
                        })?;
                }
                // Another ADD created it at the same moment and marks it.
                Err(e) if errno(&e) == Some(EEXIST) => {}
                Err(e) => return Err(kernel(format!("creating gateway device {name}"), e)),
            }
        }
        let link = self.link_by_name(name).await?.ok_or_else(|| {
            Error::kernel(
                format!("creating gateway device {name}"),
                "it vanished at once",
            )
        })?;
        if let Some(alias) = &link.alias
            && alias.starts_with(GATEWAY_ALIAS_PREFIX)
            && *alias != owner
        {
            return Err(Error::config(format!(
                "\"bridge\" {name} is already the gateway device of network {:?}; give this network its own \"bridge\" name",
                &alias[GATEWAY_ALIAS_PREFIX.len()..]
            )));
        }
        if !link.up {
            self.set_up(link.index).await?;
        }
        Ok(link.index)
    }

    /// Takes the gateway device flatnet created for `network` out of use:
    /// down, and renamed so no later ADD can find it; returns (index, new
    /// name) for the caller to delete after its answer, or None when there is nothing of ours to remove.
    pub async fn retire_gateway_device(
        &self,
        name: &str,
        network: &str,
    ) -> Result<Option<(u32, String)>> {
        match self.link_by_name(name).await? {
            Some(link) if link.alias.as_deref() == Some(gateway_alias(network).as_str()) => {
                let retired = format!("flgone{:x}", link.index);
                self.set_down(link.index).await?;
                self.rename(link.index, &retired).await?;
                Ok(Some((link.index, retired)))
            }
            _ => Ok(None),
        }
    }
}

//! GSO/GRO limits of a device, set over netlink: what flatnet's `bigTcp`
//! does to a pod's veth pair, done to the bench's bare veth pair so that
//! the gain of BIG TCP is not credited to flatnet's path.

use anyhow::{Context, bail};
use futures::TryStreamExt;
use rtnetlink::LinkUnspec;
use rtnetlink::packet_route::link::LinkAttribute;

use flatnet_harness::{Netns, enter_thread};

/// Sets the four GSO/GRO limits (generic and IPv6, IPv4) of `ifname` in
/// `netns` to `size`.
pub fn set_limits(netns: &Netns, ifname: &str, size: u32) -> anyhow::Result<()> {
    let path = netns.path();
    let ifname = ifname.to_string();
    std::thread::spawn(move || -> anyhow::Result<()> {
        enter_thread(&path).context("entering the pair's namespace")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let (connection, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(connection);
            let Some(link) = handle
                .link()
                .get()
                .match_name(ifname.clone())
                .execute()
                .try_next()
                .await?
            else {
                bail!("{ifname} is missing");
            };
            let mut message = LinkUnspec::new_with_index(link.header.index);
            for attribute in [
                LinkAttribute::GsoMaxSize(size),
                LinkAttribute::GroMaxSize(size),
                LinkAttribute::GsoIpv4MaxSize(size),
                LinkAttribute::GroIpv4MaxSize(size),
            ] {
                message = message.append_extra_attribute(attribute);
            }
            handle
                .link()
                .set(message.build())
                .execute()
                .await
                .with_context(|| format!("setting the GSO/GRO limits of {ifname} to {size}"))
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the netlink thread panicked"))?
}

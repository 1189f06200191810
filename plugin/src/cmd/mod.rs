//! One handler per CNI verb, plus what they share.

pub mod add;
pub mod check;
pub mod del;

use std::net::Ipv4Addr;

use crate::cni::config::NetConf;
use crate::cni::error::Result;
use crate::cni::result::IpConfig;
use crate::datapath::Datapath;
use crate::link::Netlink;
use crate::lock::{self, Lock};
use crate::reaper;

/// The IPv4 addresses of a result, as endpoint-map keys.
pub fn ipv4_keys(ips: &[IpConfig]) -> Vec<(Ipv4Addr, flatnet_common::Ipv4Key)> {
    ips.iter()
        .filter_map(|ip| match ip.address.ip() {
            std::net::IpAddr::V4(v4) => Some((v4, v4.octets())),
            std::net::IpAddr::V6(_) => None,
        })
        .collect()
}

/// Once a network has no endpoint left, removes what only it used: the
/// pinned datapath and the gateway device flatnet created for it (taken out
/// of use here, unregistered by the reaper). Runs under
/// the network lock held exclusively, so no ADD is half way through.
pub async fn release_network_if_empty(conf: &NetConf, host: &Netlink) -> Result<()> {
    let datapath = Datapath::new(&conf.name);
    let _lock = Lock::exclusive(&lock::network(&conf.name))?;
    if datapath.endpoint_count()? > 0 {
        return Ok(());
    }
    datapath.remove_pins()?;
    if let Some((index, retired)) = host
        .retire_gateway_device(&conf.gateway_device, &conf.name)
        .await?
    {
        reaper::defer(index, &retired);
    }
    Ok(())
}

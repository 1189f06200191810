//! One handler per CNI verb, plus what they share.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod repair;
pub mod status;

use flatnet_common::{PROG_FROM_POD, PROG_FROM_POD_XDP};

use crate::cni::config::{DatapathMode, NetConf};
use crate::cni::error::Result;
use crate::datapath::{Datapath, TC_HANDLE, TC_PRIORITY};
use crate::link::Netlink;
use crate::lock::{self, Lock};
use crate::masq;
use crate::reaper;

/// Puts this build's host-side program on a pod's host veth, replacing an
/// older one atomically (tc: same filter priority/handle; XDP: same slot).
/// tc carries the pod's counter slot as the filter's classid.
pub async fn attach_host_veth(
    datapath: &Datapath,
    mode: DatapathMode,
    host: &Netlink,
    index: u32,
    counter_slot: u32,
) -> Result<()> {
    match mode {
        DatapathMode::Tc => {
            host.add_clsact(index).await?;
            let program = datapath.program(PROG_FROM_POD)?;
            host.set_tc_ingress_bpf(
                index,
                program.raw_fd()?,
                PROG_FROM_POD,
                TC_PRIORITY,
                TC_HANDLE,
                counter_slot,
            )
            .await
        }
        DatapathMode::Xdp => {
            host.set_xdp(index, datapath.program(PROG_FROM_POD_XDP)?.raw_fd()?)
                .await
        }
    }
}

/// Once a network has no pod left, removes what only it used: the pinned
/// datapath and the gateway device flatnet created for it (taken out of use
/// here, unregistered by the reaper). Runs under the network lock held
/// exclusively, so no ADD is half way through.
pub async fn release_network_if_empty(conf: &NetConf, host: &Netlink) -> Result<()> {
    // A node agent owns this network's datapath: it stays for the next pod.
    if crate::agent::ready::is_agent_managed(&conf.name) {
        return Ok(());
    }
    let datapath = Datapath::new(&conf.name);
    // The common case, other pods remain, is answered under the shared lock:
    // concurrent DELs do not queue for the exclusive one.
    if !Lock::shared(&lock::network(&conf.name)).and_then(|_lock| datapath.has_no_pod())? {
        return Ok(());
    }
    if let Some((index, retired)) = remove_unused_network(
        &datapath,
        &conf.name,
        &conf.gateway_device,
        conf.ip_masq,
        host,
    )
    .await?
    {
        reaper::defer(index, &retired);
    }
    Ok(())
}

/// Under the network's exclusive lock (no ADD half way through), if no pod
/// is left: unpins the datapath, removes the ipMasq rules, retires the
/// gateway device (returned, renamed, for the caller to delete) and the
/// lock file. Ok(None) when pods remain or there was no device. `ip_masq`:
/// look for masquerade rules even without their marker.
pub async fn remove_unused_network(
    datapath: &Datapath,
    network: &str,
    gateway_device: &str,
    ip_masq: bool,
    host: &Netlink,
) -> Result<Option<(u32, String)>> {
    let lock = Lock::exclusive(&lock::network(network))?;
    if !datapath.has_no_pod()? {
        return Ok(None);
    }
    datapath.remove_pins()?;
    if ip_masq || masq::installed(network) {
        masq::remove(network)?;
    }
    let retired = host.retire_gateway_device(gateway_device, network).await?;
    // Last: nothing of the network is left once its lock file goes too.
    lock.remove()?;
    Ok(retired)
}

//! A network's life on a node, shared by the CNI verbs, `flatnet repair`
//! and flatnet-agent: the datapath loaded (or upgraded, or rebuilt) under
//! the network lock, programs attached to host veths, and everything of the
//! network taken away once its last pod is gone.

use super::rebuild::rebuild_pods;
use super::{NodeNetwork, markers};
use crate::DatapathMode;
use crate::bpf::{Datapath, attach_host_veth};
use crate::error::{Error, Result};
use crate::lock::{self, Lock};
use crate::masquerade;
use crate::netlink::Netlink;

/// Puts this build's program on every pod's host veth the datapath knows
/// (those still there), giving older pods their counter slot; returns how
/// many. After a load: an upgrade, a repair.
pub async fn reattach_all(
    datapath: &Datapath,
    mode: DatapathMode,
    host: &Netlink,
) -> Result<usize> {
    let mut attached = 0;
    for (index, _) in datapath.host_veths()? {
        if let Some(veth) = host.link_by_index(index).await? {
            datapath.ensure_counter_slot(index)?;
            attach_host_veth(datapath, mode, host, index, &veth.name).await?;
            attached += 1;
        }
    }
    Ok(attached)
}

/// Makes sure this build's programs for the configured mode are pinned and
/// returns the network lock to hold for the rest of the ADD: shared when
/// they already were (the common case: no verifier run per pod), exclusive
/// when this ADD loaded them. Loading over an older build moves every
/// existing pod's veth onto the new programs, atomically per veth.
pub async fn ensure_datapath(
    conf: &NodeNetwork,
    datapath: &Datapath,
    host: &Netlink,
) -> Result<Lock> {
    let lock_name = lock::network(&conf.name);
    let shared = Lock::shared(&lock_name)?;
    if datapath.is_loaded(conf.mode) {
        return Ok(shared);
    }
    drop(shared);
    let exclusive = Lock::exclusive(&lock_name)?;
    if datapath.is_loaded(conf.mode) {
        return Ok(exclusive);
    }
    if let Some(pinned) = datapath.pinned_mode()
        && pinned != conf.mode
        && datapath.pod_count()? > 0
    {
        return Err(Error::config(format!(
            "network {} runs the {} datapath with pods attached; \"datapath\": \"{}\" needs them deleted first",
            conf.name,
            pinned.as_str(),
            conf.mode.as_str()
        )));
    }
    // Maps made now are sized as the network's configuration says.
    datapath.clone().sized(&conf.map_sizing).load(conf.mode)?;
    if datapath.pod_count()? == 0 {
        // Empty maps: a new network, or pins wiped under running pods.
        rebuild_pods(&conf.name, &conf.gateway_device, conf.mode, datapath, host).await?;
    } else {
        reattach_all(datapath, conf.mode, host).await?;
    }
    datapath.retire_other_programs(conf.mode)?;
    Ok(exclusive)
}

/// Once a network has no pod left, removes what only it used: the pinned
/// datapath and the gateway device flatnet created for it (taken out of use
/// here; returned, as (ifindex, name), for the caller to delete after its
/// answer). Runs under the network lock held exclusively, so no ADD is half
/// way through.
pub async fn release_if_empty(conf: &NodeNetwork, host: &Netlink) -> Result<Option<(u32, String)>> {
    // A node agent owns this network's datapath: it stays for the next pod.
    if markers::is_agent_managed(&conf.name) {
        return Ok(None);
    }
    let datapath = Datapath::for_network(conf)?;
    // The common case, other pods remain, is answered under the shared lock:
    // concurrent DELs do not queue for the exclusive one.
    if !Lock::shared(&lock::network(&conf.name)).and_then(|_lock| datapath.has_no_live_pod())? {
        return Ok(None);
    }
    remove_unused(
        &datapath,
        &conf.name,
        &conf.gateway_device,
        conf.ip_masq,
        host,
    )
    .await
}

/// Under the network's exclusive lock (no ADD half way through), if no pod
/// is left: unpins the datapath, removes the ipMasq rules, retires the
/// gateway device (returned, renamed, for the caller to delete) and the
/// lock file. Ok(None) when pods remain or there was no device. `ip_masq`:
/// look for masquerade rules even without their marker.
pub async fn remove_unused(
    datapath: &Datapath,
    network: &str,
    gateway_device: &str,
    ip_masq: bool,
    host: &Netlink,
) -> Result<Option<(u32, String)>> {
    let lock = Lock::exclusive(&lock::network(network))?;
    // Pods whose veth is gone never had their DEL: swept here, or they
    // would keep the network (pins, gateway, lock) forever.
    datapath.remove_pods(crate::netlink::ifindex_is_gone)?;
    if !datapath.has_no_pod()? {
        return Ok(None);
    }
    datapath.remove_pins()?;
    // What the agent (or the benchmark's policy fixture) recorded of the
    // pods' NetworkPolicies: the pods are gone.
    let policy_names = markers::policy_names_file(network);
    crate::util::remove_file_if_present(&policy_names)
        .map_err(|e| Error::io(format!("removing {}", policy_names.display()), e))?;
    super::first_packet::PodRecord::remove_all(network);
    if ip_masq || masquerade::installed(network) {
        masquerade::remove(network)?;
    }
    let retired = host.retire_gateway_device(gateway_device, network).await?;
    // Last: nothing of the network is left once its lock file goes too.
    lock.remove()?;
    Ok(retired)
}

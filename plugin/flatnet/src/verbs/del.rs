//! DEL: the pod out of the datapath, veth down and on its way out, address
//! released. Succeeds when any of it, or the whole netns, is already gone.
//! Planned from the configuration first ([`TeardownPlan`]), then done.

use std::net::IpAddr;

use flatnet_common::MAP_HOST_VETHS;

use crate::after_answer::AfterAnswer;
use crate::config::NetConf;
use crate::delegate::Delegate;
use crate::error::{Error, Result};
use flatnet_cni::env::{CniEnv, Command};
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::lock::{self, Lock};
use flatnet_datapath::netlink::{AttachmentNames, Netlink, ifindex_is_gone};
use flatnet_datapath::node::first_packet::PodRecord;
use flatnet_datapath::node::{NodeNetwork, release_if_empty};
use flatnet_datapath::trace::mark;

/// What DEL takes away, worked out from the configuration and the
/// attachment alone (nothing read from the kernel yet): the same names ADD
/// gave, the addresses `prevResult` lists, the network on the node, and the
/// IPAM plugin to release the address with.
#[derive(Debug, Clone, PartialEq)]
struct TeardownPlan {
    names: AttachmentNames,
    /// None without `prevResult`: every stale entry of the veth is swept.
    addresses: Option<Vec<IpAddr>>,
    network: NodeNetwork,
    ipam_type: Option<String>,
}

impl TeardownPlan {
    fn new(env: &CniEnv, conf: &NetConf) -> Self {
        TeardownPlan {
            names: AttachmentNames::new(&conf.name, &env.container_id, &env.ifname),
            addresses: conf
                .prev_result
                .as_ref()
                .map(|prev| prev.ips.iter().map(|ip| ip.address.ip()).collect()),
            network: conf.node_network(),
            ipam_type: conf.ipam_type.clone(),
        }
    }
}

pub async fn del(
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    after: &mut AfterAnswer,
) -> Result<()> {
    teardown(&TeardownPlan::new(env, conf), env, stdin, after).await
}

/// DEL from its plan (`env` for the IPAM plugin's search path, `stdin`
/// passed on to it).
async fn teardown(
    plan: &TeardownPlan,
    env: &CniEnv,
    stdin: &[u8],
    after: &mut AfterAnswer,
) -> Result<()> {
    let names = &plan.names;
    let host = Netlink::connect()?;
    let host_link = host.link_by_name(&names.host_veth).await?;
    let datapath = Datapath::for_network(&plan.network)?;
    mark("parse, connect, find veth");

    // A datapath that cannot be cleared (a pin unreadable) must not keep
    // the address or the veth: the rest goes on and the error is reported
    // at the end, so the runtime retries.
    let datapath_cleared = clear_pod(plan, &datapath, host_link.as_ref().map(|l| l.index));
    mark("pod removed from the datapath");
    if let Some(link) = &host_link {
        // Down is instant and cuts the pod off; the unregister (~20 ms of RCU
        // waiting in the kernel) is left for after the answer, checked by index and name.
        host.set_down(link.index).await?;
        after.delete_link(link.index, &link.name);
    }
    // Its links go with the device; their pins are ours to take away (a
    // DEL whose veth is already gone may still find them). While the veth
    // exists, dropping a pin would detach its tcx link now, which waits an
    // RCU grace period holding rtnl: it is unpinned after the delete.
    if datapath.pin_dir().exists() {
        match &host_link {
            Some(_) => after.unpin(&datapath, &names.host_veth),
            None => datapath.unpin_pod_links(&names.host_veth)?,
        }
    }
    mark("veth down, unregister deferred");
    let ipam_released = match &plan.ipam_type {
        Some(kind) => Delegate::find(kind, &env.path)
            .and_then(|ipam| ipam.run(Command::Del, stdin))
            .map(drop)
            .map_err(Error::from),
        None => Ok(()),
    };
    mark("IPAM DEL");
    // The rest of the teardown does not need the address back: it goes on
    // when IPAM failed (the error is still reported, so the runtime retries
    // DEL and the retry releases the address).
    let network_released = release_if_empty(&plan.network, &host).await;
    if let Ok(Some((index, gateway))) = &network_released {
        after.delete_link(*index, gateway);
    }
    datapath_cleared
        .and(ipam_released)
        .and(network_released.map(drop).map_err(Error::from))
}

/// The pod out of the datapath's maps (its veth `index` when it still
/// exists, else every pod whose veth is gone), its policy record and its
/// hostPorts.
fn clear_pod(plan: &TeardownPlan, datapath: &Datapath, index: Option<u32>) -> Result<()> {
    // Checked again under the lock: a concurrent DEL of the network's last
    // pod may have unpinned everything while this one waited for it.
    // (The lock is dropped at the end of this block: the release after it
    // may take it exclusively.)
    if let Some(lock) = datapath
        .map_path(MAP_HOST_VETHS)
        .exists()
        .then(|| Lock::shared(&lock::network(&plan.network.name)))
        .transpose()?
        && datapath.map_path(MAP_HOST_VETHS).exists()
    {
        lock.note_activity();
        match index {
            Some(index) => datapath.remove_pod(index, plan.addresses.as_deref())?,
            // The netns was deleted first and the veth went with it: the
            // entries point at a vanished ifindex. Any such stale pod (ours or
            // a crashed neighbour's) is swept.
            None => datapath.remove_pods(ifindex_is_gone)?,
        }
    }
    // The agent's record of who the pod was (ADD wrote it when an agent
    // enforces NetworkPolicy).
    PodRecord::remove(&plan.network.name, &plan.names.host_veth);
    // Its hostPorts (ADD served them when the runtime passed portMappings).
    datapath.remove_host_ports(&plan.names.host_veth)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env() -> CniEnv {
        CniEnv {
            container_id: "c1".into(),
            netns: None,
            ifname: "eth0".into(),
            args: Vec::new(),
            path: Vec::new(),
        }
    }

    fn conf(extra: serde_json::Value) -> NetConf {
        let mut value = json!({"cniVersion": "1.0.0", "name": "pods", "type": "flatnet",
            "bridge": "flgw3", "ipam": {"type": "host-local"}});
        for (key, item) in extra.as_object().unwrap() {
            value[key] = item.clone();
        }
        NetConf::parse(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn the_teardown_names_what_add_made_and_the_addresses_prev_result_lists() {
        let conf = conf(json!({"prevResult": {"cniVersion": "1.0.0",
            "ips": [{"address": "10.1.0.5/24"}, {"address": "fd00::5/64"}]}}));
        let plan = TeardownPlan::new(&env(), &conf);
        assert_eq!(plan.names, AttachmentNames::new("pods", "c1", "eth0"));
        assert_eq!(
            plan.addresses,
            Some(vec![
                "10.1.0.5".parse().unwrap(),
                "fd00::5".parse().unwrap()
            ])
        );
        assert_eq!(plan.network, conf.node_network());
        assert_eq!(plan.network.gateway_device, "flgw3");
        assert_eq!(plan.ipam_type.as_deref(), Some("host-local"));
    }

    #[test]
    fn without_prev_result_every_stale_entry_of_the_veth_is_swept() {
        let plan = TeardownPlan::new(&env(), &conf(json!({})));
        assert_eq!(plan.addresses, None);
    }
}

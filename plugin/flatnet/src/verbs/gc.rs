//! GC (1.1.0): removes what this network holds for attachments the runtime
//! no longer knows (`cni.dev/valid-attachments`): host veths (the pod end
//! goes with them), datapath entries, hostPorts, and, through the IPAM plugin's own GC,
//! addresses. Goes on past individual failures and reports them together.
//!
//! The network's pods are the datapath's host veths (ifindex -> endpoint).
//! A veth is valid when its name is the one `AttachmentNames` gives a valid
//! (containerID, ifname); an entry whose ifindex is gone, or now belongs to
//! a device with another MAC (the index was reused), is stale.

use std::collections::{BTreeMap, HashSet};

use flatnet_common::{Endpoint, MAP_HOST_VETHS};

use crate::config::NetConf;
use crate::delegate::Delegate;
use crate::error::{Error, Result};
use flatnet_cni::env::{CniEnv, Command};
use flatnet_cni::error::Error as CniError;
use flatnet_cni::runtime::valid_attachments;
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::lock::{self, Lock};
use flatnet_datapath::netlink::{AttachmentNames, Netlink};
use flatnet_datapath::node::first_packet::PodRecord;
use flatnet_datapath::node::release_if_empty;

use crate::after_answer::AfterAnswer;

pub async fn gc(env: &CniEnv, conf: &NetConf, stdin: &[u8], after: &mut AfterAnswer) -> Result<()> {
    let valid: HashSet<String> = valid_attachments(stdin)?
        .iter()
        .map(|a| AttachmentNames::new(&conf.name, &a.container_id, &a.ifname).host_veth)
        .collect();
    let host = Netlink::connect()?;
    let mut failures: Vec<Error> = Vec::new();
    PodRecord::retain(&conf.name, |veth| valid.contains(veth));

    let datapath = conf.pinned_datapath()?;
    if let Err(e) = datapath.retain_host_ports(|veth| valid.contains(veth)) {
        failures.push(e.into());
    }
    if datapath.map_path(MAP_HOST_VETHS).exists()
        && let Err(e) = sweep(conf, &datapath, &host, &valid, &mut failures).await
    {
        failures.push(e);
    }
    if let Some(kind) = &conf.ipam_type
        && let Err(e) =
            Delegate::find(kind, &env.path).and_then(|ipam| ipam.run(Command::Gc, stdin))
    {
        failures.push(e.into());
    }
    match release_if_empty(&conf.node_network(), &host).await {
        Ok(Some((index, gateway))) => after.delete_link(index, &gateway),
        Ok(None) => {}
        Err(e) => failures.push(e.into()),
    }
    report(failures)
}

/// Removes the stale pods of the datapath; per-pod failures go to `failures`.
async fn sweep(
    conf: &NetConf,
    datapath: &Datapath,
    host: &Netlink,
    valid: &HashSet<String>,
    failures: &mut Vec<Error>,
) -> Result<()> {
    // Exclusive: no ADD or DEL of this network changes the maps meanwhile.
    let _lock = Lock::exclusive(&lock::network(&conf.name))?;
    // A DEL of the last pod may have unpinned the network meanwhile.
    if !datapath.map_path(MAP_HOST_VETHS).exists() {
        return Ok(());
    }
    let mut pods: BTreeMap<u32, Endpoint> = datapath.host_veths()?.into_iter().collect();
    for (_, endpoint) in datapath.all_endpoints()? {
        pods.entry(endpoint.host_ifindex).or_insert(endpoint);
    }
    let mut doomed = HashSet::new();
    let mut veths = Vec::new();
    for (index, endpoint) in pods {
        match host.link_by_index(index).await {
            Ok(None) => {
                doomed.insert(index);
            }
            Ok(Some(link)) if valid.contains(&link.name) => {}
            Ok(Some(link)) => {
                doomed.insert(index);
                // Only a device that is still this pod's veth is deleted.
                if link.mac == Some(endpoint.host_mac) {
                    veths.push(link);
                }
            }
            Err(e) => failures.push(e.into()),
        }
    }
    if doomed.is_empty() {
        return Ok(());
    }
    // Out of the maps first, so nothing is redirected to a veth being deleted.
    datapath.remove_pods(|index| doomed.contains(&index))?;
    for veth in veths {
        if let Err(e) = host.delete_link(veth.index).await {
            eprintln!("flatnet: GC: deleting {}: {e}", veth.name);
            failures.push(e.into());
        }
        if let Err(e) = datapath.unpin_pod_links(&veth.name) {
            failures.push(e.into());
        }
    }
    Ok(())
}

/// Ok when nothing failed; else one error carrying every failure, with the
/// first failure's code.
fn report(failures: Vec<Error>) -> Result<()> {
    let mut failures = failures.into_iter();
    let Some(first) = failures.next() else {
        return Ok(());
    };
    let rest: Vec<String> = failures.map(|e| e.to_string()).collect();
    if rest.is_empty() {
        return Err(first);
    }
    Err(Error::Cni(CniError::Delegated {
        plugin: "GC".into(),
        code: first.code(),
        msg: format!("{} failures: {first}; {}", rest.len() + 1, rest.join("; ")),
        details: String::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_reported_together_with_the_first_code() {
        assert!(report(Vec::new()).is_ok());
        let one = report(vec![Error::config("x")]).unwrap_err();
        assert_eq!(one.code(), 7);
        let many = report(vec![
            Error::kernel("deleting fl1", "busy"),
            Error::config("y"),
        ])
        .unwrap_err();
        assert_eq!(many.code(), 100);
        let msg = many.to_string();
        assert!(msg.contains("2 failures"), "{msg}");
        assert!(msg.contains("fl1") && msg.contains('y'), "{msg}");
    }
}

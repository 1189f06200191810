//! `flatnet-agent --uninstall`: takes away what the agent put on this node,
//! for after its DaemonSet is gone (an agent that stops, for a restart or an
//! upgrade, leaves everything in place on purpose). Every step is tried even
//! when an earlier one failed, and each finds nothing to do the second time.
//!
//! Removed: the ready marker, the conflist (only if it is flatnet's, for
//! this network, agent-managed), the `.managed` marker (so the last pod's
//! DEL unpins the datapath again), the remote-CIDR map entries, the
//! no-masquerade set elements, every `proto 102` route, and `from_uplink`'s
//! tc filter (by its priority and handle, wherever it is). Kept: the
//! datapath and the gateway device while pods use them (pods on this node
//! keep talking to each other and to the host), the plugin binaries (their
//! DEL needs them), the clsact qdisc (other filters may sit on it). With no
//! pod left, the datapath, the ipMasq rules and the gateway device go too.

use futures::{StreamExt, TryStreamExt};
use rtnetlink::Handle;
use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption};
use serde_json::Value;

use crate::config::Args;
use crate::error::{AgentError, Result};
use crate::node_state::{UPLINK_TC_HANDLE, UPLINK_TC_PRIORITY, network_conf, remove_if_present};
use crate::peers::carrier::VXLAN_DEVICE;
use crate::peers::routes::Routes;
use flatnet_common::PROG_FROM_UPLINK;
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::masquerade;
use flatnet_datapath::netlink::{Netlink, errno};
use flatnet_datapath::node::first_packet;
use flatnet_datapath::node::markers::{self as ready, AGENT_MANAGED_KEY};
use flatnet_datapath::node::remove_unused;

/// Runs every step; an error names the steps that failed.
pub async fn uninstall(args: Args) -> Result<()> {
    let conf = network_conf(&args)?;
    let network = args.network.clone();
    let datapath = Datapath::with_root(&args.pin_root, &network);
    let mut failed: Vec<String> = Vec::new();
    let mut note = |step: &str, outcome: Result<()>| {
        if let Err(e) = outcome {
            tracing::error!(step, error = %e, "uninstall step failed");
            failed.push(format!("{step}: {e}"));
        }
    };

    // STATUS answers 50 from here on.
    note(
        "ready marker",
        remove_if_present(&ready::ready_marker(&network)).map(|was| {
            if was {
                tracing::warn!(
                    "the ready marker was there: if an agent still runs, it sets the node up again at its next resync"
                );
            }
        }),
    );
    let conflist = args.cni_conf_dir.join(&args.conflist_name);
    note("conflist", remove_conflist(&conflist, &network));
    note(
        "managed marker",
        remove_if_present(&ready::managed_marker(&network)).map(drop),
    );
    note(
        "policy names",
        remove_if_present(&ready::policy_names_file(&network)).map(drop),
    );
    // New pods start open again (no agent enforces policy any more).
    note(
        "namespaces' isolation",
        remove_if_present(&first_packet::isolation_file(&network)).map(drop),
    );
    first_packet::PodRecord::remove_all(&network);
    // Map entries before routes: a CIDR left in the map without its route
    // would go wherever the FIB says.
    if datapath.exists() {
        note(
            "remote-CIDR map",
            datapath.set_remote_cidrs(&[]).map_err(AgentError::from),
        );
        note(
            "tunnel map",
            datapath.set_tunnel(None).map_err(AgentError::from),
        );
        // Off every socket of the node first: ClusterIPs go back to
        // kube-proxy's rules.
        note(
            "Service socket programs",
            datapath.detach_services().map_err(AgentError::from),
        );
    }
    note(
        "no-masquerade sets",
        masquerade::forget_unmasqueraded(&network).map_err(AgentError::from),
    );
    note("peer routes", remove_routes().await);
    note("VXLAN device", remove_vxlan_device().await);
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| AgentError::io("opening a netlink socket", e))?;
    tokio::spawn(connection);
    note("uplink filter", remove_uplink_filters(&handle).await);
    note("uplink link", unpin_uplink_links(&datapath));
    note(
        "unused datapath",
        release_if_unused(&datapath, &network, &conf.gateway_device).await,
    );

    if failed.is_empty() {
        tracing::info!(%network, "flatnet-agent's setup removed from this node");
        Ok(())
    } else {
        Err(AgentError::Incomplete(failed.join("; ")))
    }
}

/// True for a conflist the agent writes for `network`: that name, and a
/// flatnet entry marked agent-managed. Anything else is someone else's.
pub fn is_agents_conflist(list: &Value, network: &str) -> bool {
    list["name"].as_str() == Some(network)
        && list["plugins"].as_array().is_some_and(|plugins| {
            plugins
                .iter()
                .any(|p| p["type"] == "flatnet" && p[AGENT_MANAGED_KEY] == Value::Bool(true))
        })
}

fn remove_conflist(path: &std::path::Path, network: &str) -> Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(AgentError::io(format!("reading {}", path.display()), e)),
    };
    let ours =
        serde_json::from_slice::<Value>(&bytes).is_ok_and(|l| is_agents_conflist(&l, network));
    if !ours {
        tracing::warn!(path = %path.display(), "not the agent's conflist for this network: left alone");
        return Ok(());
    }
    remove_if_present(path)?;
    tracing::info!(path = %path.display(), "conflist removed");
    Ok(())
}

async fn remove_routes() -> Result<()> {
    let routes = Routes::connect()?;
    for route in routes.ours().await? {
        routes.remove(&route).await?;
        tracing::info!(cidr = %route.cidr, "peer route removed");
    }
    Ok(())
}

/// The VXLAN device (`--routing vxlan|auto`), with the neighbour entries
/// of its tunnelled routes' next hops.
async fn remove_vxlan_device() -> Result<()> {
    let host = flatnet_datapath::netlink::Netlink::connect()?;
    if let Some(link) = host.link_by_name(VXLAN_DEVICE).await? {
        host.delete_link(link.index).await?;
        tracing::info!(device = VXLAN_DEVICE, "VXLAN device removed");
    }
    Ok(())
}

/// True for the agent's `from_uplink` filter: its priority, its handle, a
/// BPF program of that name (the head entry of the priority has handle 0).
fn is_uplink_filter(msg: &TcMessage) -> bool {
    let program = msg.attributes.iter().any(|attr| match attr {
        TcAttribute::Options(options) => options.iter().any(|o| {
            matches!(o, TcOption::Bpf(TcFilterBpfOption::ProgName(name)) if name.starts_with(PROG_FROM_UPLINK))
        }),
        _ => false,
    });
    msg.header.info >> 16 == u32::from(UPLINK_TC_PRIORITY)
        && u32::from(msg.header.handle) == UPLINK_TC_HANDLE
        && program
}

/// Removes the agent's filter from every interface that has it (the
/// uplink is not known without a node list, and may have changed).
async fn remove_uplink_filters(handle: &Handle) -> Result<()> {
    let failed = |context: String| {
        move |e: rtnetlink::Error| AgentError::Route {
            context,
            reason: e.to_string(),
        }
    };
    let mut indexes = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(link) = links
        .try_next()
        .await
        .map_err(failed("listing interfaces".into()))?
    {
        indexes.push(link.header.index);
    }
    for index in indexes {
        let mut ours = Vec::new();
        let mut filters = handle
            .traffic_filter(index as i32)
            .get()
            .ingress()
            .execute();
        loop {
            match filters.try_next().await {
                Ok(Some(msg)) if is_uplink_filter(&msg) => ours.push(msg),
                Ok(Some(_)) => {}
                Ok(None) => break,
                // No clsact qdisc, or the interface just went: nothing there.
                Err(e)
                    if matches!(
                        errno(&e),
                        Some(libc::ENOENT) | Some(libc::EINVAL) | Some(libc::ENODEV)
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    return Err(failed(format!("listing tc filters of interface #{index}"))(
                        e,
                    ));
                }
            }
        }
        for found in ours {
            let mut message = TcMessage::with_index(index as i32);
            message.header.parent = found.header.parent;
            message.header.handle = found.header.handle;
            message.header.info = found.header.info;
            message.attributes.push(TcAttribute::Kind("bpf".into()));
            let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelTrafficFilter(message));
            request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
            let context = format!("removing from_uplink's tc filter from interface #{index}");
            let mut responses = handle
                .clone()
                .request(request)
                .map_err(failed(context.clone()))?;
            while let Some(response) = responses.next().await {
                if let NetlinkPayload::Error(err) = response.payload
                    && err.code.is_some()
                {
                    let error = rtnetlink::Error::NetlinkError(err);
                    if !matches!(errno(&error), Some(libc::ENOENT) | Some(libc::ENODEV)) {
                        return Err(failed(context)(error));
                    }
                }
            }
            tracing::info!(ifindex = index, "from_uplink's tc filter removed");
        }
    }
    Ok(())
}

/// Unpins the agent's uplink and VXLAN device links: with the pin gone and
/// no process holding it, the kernel takes the program off the device.
fn unpin_uplink_links(datapath: &Datapath) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(datapath.links_dir()) else {
        return Ok(());
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("uplink-") || name.starts_with("tunnel-") {
            remove_if_present(&entry.path())?;
            tracing::info!(pin = %entry.path().display(), "the agent's link removed");
        }
    }
    Ok(())
}

/// With no pod left, what the last pod's DEL would have removed had the
/// agent not owned the network: pins, ipMasq rules, gateway device (deleted
/// here, not deferred: no runtime waits on this process).
async fn release_if_unused(datapath: &Datapath, network: &str, gateway: &str) -> Result<()> {
    if !datapath.exists() {
        return Ok(());
    }
    let host = Netlink::connect()?;
    if let Some((index, _)) = remove_unused(datapath, network, gateway, true, &host).await? {
        host.delete_link(index).await?;
    }
    if datapath.exists() {
        tracing::info!(
            pods = datapath.pod_count()?,
            "pods remain: the datapath stays until the last one's DEL removes it"
        );
    } else {
        tracing::info!(
            network,
            "no pod left: datapath unpinned, gateway device removed"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::{ConflistSpec, render_conflist};
    use flatnet_datapath::DatapathMode;

    #[test]
    fn only_the_agents_own_conflist_counts_as_its_own() {
        let spec = ConflistSpec {
            network: "pods".into(),
            bridge: "flatnet0".into(),
            datapath: DatapathMode::Tc,
            mtu: None,
            ip_masq: false,
            ipam_data_dir: None,
            pin_root: std::path::PathBuf::from("/sys/fs/bpf/flatnet"),
            portmap: true,
            host_ports_in_bpf: false,
            bandwidth: true,
            big_tcp: None,
            cni_versions: vec!["1.0.0", "1.1.0"],
            map_sizing: Default::default(),
        };
        let list = render_conflist(&spec, &["10.244.1.0/24".parse().unwrap()]).unwrap();
        assert!(is_agents_conflist(&list, "pods"));
        assert!(!is_agents_conflist(&list, "other"));
        let mut by_hand = list.clone();
        by_hand["plugins"][0]
            .as_object_mut()
            .unwrap()
            .remove(AGENT_MANAGED_KEY);
        assert!(!is_agents_conflist(&by_hand, "pods"));
        let bridge = serde_json::json!({"name": "pods", "plugins": [{"type": "bridge"}]});
        assert!(!is_agents_conflist(&bridge, "pods"));
    }
}

//! CHECK: the attachment still looks the way ADD left it (prevResult).

use rtnetlink::packet_route::AddressFamily;

use flatnet_common::{PROG_FROM_POD, PROG_FROM_POD_XDP};

use crate::cni::config::{DatapathMode, NetConf};
use crate::cni::env::{CniEnv, Command};
use crate::cni::error::{Error, Result};
use crate::datapath::Datapath;
use crate::delegate::Delegate;
use crate::link::{AttachmentNames, Netlink, format_mac, parse_mac};
use crate::netns;

fn mismatch(msg: impl Into<String>) -> Error {
    Error::CheckMismatch(msg.into())
}

pub async fn check(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        Error::config("CHECK needs \"prevResult\": the result of the ADD being checked")
    })?;
    let netns_path = env
        .netns
        .as_deref()
        .ok_or_else(|| Error::invalid_env("CNI_NETNS", "is missing"))?;
    let netns = netns::open_cni_netns(netns_path)?;
    let names = AttachmentNames::new(&conf.name, &env.container_id, &env.ifname);
    let host = Netlink::connect()?;

    // Host side: the veth and the program on it.
    let host_link = host.link_by_name(&names.host_veth).await?.ok_or_else(|| {
        mismatch(format!(
            "host veth {} of container {} ({}) is missing",
            names.host_veth, env.container_id, env.ifname
        ))
    })?;
    let datapath = Datapath::new(&conf.name);
    if !datapath.is_loaded(conf.datapath) {
        return Err(mismatch(format!(
            "the {} datapath of network {} is not pinned under {}",
            conf.datapath.as_str(),
            conf.name,
            datapath.pin_dir().display()
        )));
    }
    match conf.datapath {
        DatapathMode::Tc => {
            let program_id = datapath.program(PROG_FROM_POD)?.id()?;
            let attached = host.tc_ingress_programs(host_link.index).await?;
            if !attached.iter().any(|(id, _)| *id == program_id) {
                return Err(mismatch(format!(
                    "host veth {} has no {PROG_FROM_POD} program (id {program_id}) at tc ingress; attached: {attached:?}",
                    names.host_veth
                )));
            }
        }
        DatapathMode::Xdp => {
            let program_id = datapath.program(PROG_FROM_POD_XDP)?.id()?;
            if host_link.xdp_prog_id != Some(program_id) {
                return Err(mismatch(format!(
                    "host veth {} runs XDP program {:?}, not {PROG_FROM_POD_XDP} (id {program_id})",
                    names.host_veth, host_link.xdp_prog_id
                )));
            }
        }
    }

    // Pod side: interface, MAC, addresses, routes.
    let pod = Netlink::connect_in(&netns)?;
    let pod_link = pod.link_by_name(&env.ifname).await?.ok_or_else(|| {
        mismatch(format!(
            "interface {} is missing in {}",
            env.ifname,
            netns_path.display()
        ))
    })?;
    let prev_iface = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && i.sandbox.is_some());
    if let Some(expected) = prev_iface
        .and_then(|i| prev.interfaces[i].mac.as_deref())
        .and_then(parse_mac)
        && pod_link.mac != Some(expected)
    {
        return Err(mismatch(format!(
            "interface {} has MAC {}, prevResult says {}",
            env.ifname,
            pod_link.mac.as_ref().map(format_mac).unwrap_or_default(),
            format_mac(&expected)
        )));
    }
    let ours: Vec<_> = prev
        .ips
        .iter()
        // flatnet's own IPs always name its interface; one naming none is
        // an earlier plugin's (unless no interface of ours is listed at all).
        .filter(|ip| ip.interface == prev_iface)
        .cloned()
        .collect();
    let addresses = pod.addresses(pod_link.index).await?;
    for ip in &ours {
        if !addresses.contains(&ip.address) {
            return Err(mismatch(format!(
                "address {} is missing from {} in {} (found: {})",
                ip.address,
                env.ifname,
                netns_path.display(),
                if addresses.is_empty() {
                    "none".to_string()
                } else {
                    addresses
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
    }
    let mut routes = pod.routes(AddressFamily::Inet).await?;
    routes.extend(pod.routes(AddressFamily::Inet6).await?);
    for route in &prev.routes {
        let present = routes
            .iter()
            .any(|r| r.dst == route.dst && (route.gw.is_none() || r.gateway == route.gw));
        if !present {
            let via = route.gw.map(|gw| format!(" via {gw}")).unwrap_or_default();
            return Err(mismatch(format!(
                "route {}{via} is missing in {}",
                route.dst,
                netns_path.display()
            )));
        }
    }

    // Datapath: one endpoint per address, pointing at this veth.
    for ip in &ours {
        let address = ip.address.ip();
        let endpoint = datapath
            .endpoint(address)?
            .ok_or_else(|| mismatch(format!("the datapath has no endpoint for {address}")))?;
        if endpoint.host_ifindex != host_link.index
            || Some(endpoint.pod_mac) != pod_link.mac
            || Some(endpoint.host_mac) != host_link.mac
        {
            return Err(mismatch(format!(
                "endpoint {address} is {{ifindex {}, pod {}, host {}}}, the interfaces are {{ifindex {}, pod {}, host {}}}",
                endpoint.host_ifindex,
                format_mac(&endpoint.pod_mac),
                format_mac(&endpoint.host_mac),
                host_link.index,
                pod_link.mac.as_ref().map(format_mac).unwrap_or_default(),
                host_link.mac.as_ref().map(format_mac).unwrap_or_default(),
            )));
        }
    }

    let ipam = Delegate::find(conf.require_ipam()?, &env.path)?;
    ipam.run(Command::Check, stdin)?;
    Ok(())
}

//! CHECK: the kernel still holds what ADD planned. The plan is rebuilt from
//! `prevResult` (`plan.rs`) and each part compared with what is there: the
//! host veth and its program, the pod's interface, MAC, addresses and
//! routes, the host routes and neighbours, the datapath's endpoints and
//! what it leaves to the bandwidth plugin, the gateway device's addresses,
//! the masquerade rules with `ipMasq`, and the node's forwarding.

use rtnetlink::packet_route::AddressFamily;

use flatnet_common::{PROG_FROM_POD, PROG_FROM_POD_PASSED, PROG_FROM_POD_XDP, PROG_TO_POD};

use super::plan::{AttachmentPlan, InterfacePlan};
use crate::config::{DatapathMode, NetConf};
use crate::delegate::Delegate;
use crate::error::{Error, Result};
use flatnet_cni::env::{CniEnv, Command};
use flatnet_cni::error::Error as CniError;
use flatnet_common::{ENDPOINT_F_SHAPED_INGRESS, SOURCES_F_SHAPED_EGRESS};
use flatnet_datapath::bpf::{self, AttachMode, Datapath, Shaping, hook_programs, ingress_programs};
use flatnet_datapath::masquerade;
use flatnet_datapath::netlink::TcHook;
use flatnet_datapath::netlink::{LinkState, Netlink, RouteState, format_mac};

fn mismatch(msg: impl Into<String>) -> Error {
    CniError::CheckMismatch(msg.into()).into()
}

pub async fn check(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        Error::config("CHECK needs \"prevResult\": the result of the ADD being checked")
    })?;
    let netns_path = env
        .netns
        .as_deref()
        .ok_or_else(|| Error::invalid_env("CNI_NETNS", "is missing"))?;
    let netns = super::open_cni_netns(netns_path)?;
    let interface = InterfacePlan::new(conf, &env.container_id, &env.ifname, netns_path);
    let tcx = bpf::attach_mode() == AttachMode::Tcx;
    let plan = AttachmentPlan::for_check(conf, interface, prev, tcx)?;
    let host = Netlink::connect()?;

    let host_link = host
        .link_by_name(&plan.interface.host_veth)
        .await?
        .ok_or_else(|| {
            mismatch(format!(
                "host veth {} of container {} ({}) is missing",
                plan.interface.host_veth, env.container_id, env.ifname
            ))
        })?;
    let datapath = Datapath::for_network(&plan.network)?;
    check_program(&plan, &datapath, &host, &host_link).await?;
    let pod = Netlink::connect_in(&netns)?;
    let pod_link = check_pod_side(&plan, &pod).await?;
    check_host_side(&plan, &host, &host_link).await?;
    for link in [&host_link, &pod_link] {
        check_big_tcp(&plan, link)?;
    }
    check_endpoints(&plan, &datapath, &host_link, &pod_link)?;
    check_shaping(&plan, &datapath)?;
    check_gateway(&plan, &host).await?;
    check_masquerade(&plan)?;
    let forwarding = plan.forwarding.problems();
    if !forwarding.is_empty() {
        return Err(mismatch(format!(
            "network {}: {}",
            plan.network.name,
            forwarding.join("; ")
        )));
    }

    let ipam = Delegate::find(conf.require_ipam()?, &env.path)?;
    ipam.run(Command::Check, stdin)?;
    Ok(())
}

/// This build's program for the network's mode runs on the host veth.
async fn check_program(
    plan: &AttachmentPlan,
    datapath: &Datapath,
    host: &Netlink,
    host_link: &LinkState,
) -> Result<()> {
    let mode = plan.network.mode;
    if !datapath.is_loaded(mode) {
        return Err(mismatch(format!(
            "the {} datapath of network {} is not pinned under {}",
            mode.as_str(),
            plan.network.name,
            datapath.pin_dir().display()
        )));
    }
    let veth = &plan.interface.host_veth;
    if mode == DatapathMode::Xdp {
        let program_id = datapath.program(PROG_FROM_POD_XDP)?.id()?;
        if host_link.xdp_prog_id != Some(program_id) {
            return Err(mismatch(format!(
                "host veth {veth} runs XDP program {:?}, not {PROG_FROM_POD_XDP} (id {program_id})",
                host_link.xdp_prog_id
            )));
        }
    }
    // tc ingress: `from_pod`, or in XDP mode `from_pod_passed` behind the
    // XDP program (without it a local backend's replies to an outside
    // client go out untranslated).
    let ingress = match mode {
        DatapathMode::Tc => PROG_FROM_POD,
        DatapathMode::Xdp => PROG_FROM_POD_PASSED,
    };
    let program_id = datapath.program(ingress)?.id()?;
    let attached = ingress_programs(host, host_link.index, veth).await?;
    if !attached.iter().any(|(id, _)| *id == program_id) {
        return Err(mismatch(format!(
            "host veth {veth} has no {ingress} program (id {program_id}) at ingress; attached: {attached:?}"
        )));
    }
    // Both modes: `to_pod` at egress (a cls_bpf filter until the move to
    // tcx after ADD's answer). Without it what the stack delivers escapes
    // the pod's ingress policy, and a UDP flow's kept "clear" outlives the
    // stack's turn to carry it (see the eBPF crate's flow/).
    let to_pod = datapath.program(PROG_TO_POD)?.id()?;
    let egress = hook_programs(host, host_link.index, veth, TcHook::Egress).await?;
    if !egress.iter().any(|(id, _)| *id == to_pod) {
        return Err(mismatch(format!(
            "host veth {veth} has no {PROG_TO_POD} program (id {to_pod}) at egress; attached: {egress:?}"
        )));
    }
    Ok(())
}

/// Inside the pod: the interface with its MAC, the addresses, the routes.
async fn check_pod_side(plan: &AttachmentPlan, pod: &Netlink) -> Result<LinkState> {
    let (ifname, netns) = (&plan.interface.ifname, plan.interface.netns.display());
    let pod_link = pod
        .link_by_name(ifname)
        .await?
        .ok_or_else(|| mismatch(format!("interface {ifname} is missing in {netns}")))?;
    if pod_link.mac != Some(plan.interface.pod_mac) {
        return Err(mismatch(format!(
            "interface {ifname} has MAC {}, prevResult says {}",
            pod_link.mac.as_ref().map(format_mac).unwrap_or_default(),
            format_mac(&plan.interface.pod_mac)
        )));
    }
    let addresses = pod.addresses(pod_link.index).await?;
    for ip in &plan.ips {
        if !addresses.contains(&ip.address) {
            let found = if addresses.is_empty() {
                "none".to_string()
            } else {
                addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(mismatch(format!(
                "address {} is missing from {ifname} in {netns} (found: {found})",
                ip.address
            )));
        }
    }
    let routes = all_routes(pod).await?;
    for route in &plan.pod_routes {
        let present = routes
            .iter()
            .any(|r| r.dst == route.dst && (route.gw.is_none() || r.gateway == route.gw));
        if !present {
            let via = route.gw.map(|gw| format!(" via {gw}")).unwrap_or_default();
            return Err(mismatch(format!(
                "route {}{via} is missing in {netns}",
                route.dst
            )));
        }
    }
    Ok(pod_link)
}

/// On the host: a route and a permanent neighbour per pod address on the
/// host veth.
async fn check_host_side(
    plan: &AttachmentPlan,
    host: &Netlink,
    host_link: &LinkState,
) -> Result<()> {
    let veth = &plan.interface.host_veth;
    let routes = all_routes(host).await?;
    for route in &plan.host_routes {
        if !routes
            .iter()
            .any(|r| r.dst == route.dst && r.oif == Some(host_link.index))
        {
            return Err(mismatch(format!(
                "the host has no route to {} via {veth}",
                route.dst
            )));
        }
    }
    let neighbours = host.neighbours(host_link.index).await?;
    for (ip, mac) in &plan.neighbours {
        if !neighbours.iter().any(|(n, m)| n == ip && m == mac) {
            return Err(mismatch(format!(
                "the host has no neighbour entry {ip} -> {} on {veth}",
                format_mac(mac)
            )));
        }
    }
    Ok(())
}

/// The datapath: one endpoint per address, pointing at this veth and these
/// MACs.
fn check_endpoints(
    plan: &AttachmentPlan,
    datapath: &Datapath,
    host_link: &LinkState,
    pod_link: &LinkState,
) -> Result<()> {
    for address in &plan.endpoint_addresses {
        let endpoint = datapath
            .endpoint(*address)?
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
    Ok(())
}

async fn all_routes(netlink: &Netlink) -> Result<Vec<RouteState>> {
    let mut routes = netlink.routes(AddressFamily::Inet).await?;
    routes.extend(netlink.routes(AddressFamily::Inet6).await?);
    Ok(routes)
}

/// The fast path leaves to the stack what the runtime asked the bandwidth
/// plugin to shape (`runtimeConfig.bandwidth`), and only that.
fn check_shaping(plan: &AttachmentPlan, datapath: &Datapath) -> Result<()> {
    let Some(address) = plan.endpoint_addresses.first() else {
        return Ok(());
    };
    let Some(endpoint) = datapath.endpoint(*address)? else {
        return Ok(());
    };
    let sources = datapath.sources(endpoint.counter_slot)?;
    let recorded = Shaping {
        ingress: endpoint.flags & ENDPOINT_F_SHAPED_INGRESS != 0,
        egress: sources.flags & SOURCES_F_SHAPED_EGRESS != 0,
    };
    if recorded != plan.shaping {
        return Err(mismatch(format!(
            "the datapath shapes {recorded:?} for this pod, runtimeConfig.bandwidth asks for {:?}",
            plan.shaping
        )));
    }
    Ok(())
}

/// The gateway device exists and holds each range's gateway address.
async fn check_gateway(plan: &AttachmentPlan, host: &Netlink) -> Result<()> {
    let device = &plan.network.gateway_device;
    let Some(link) = host.link_by_name(device).await? else {
        return Err(mismatch(format!(
            "gateway device {device} of network {} is missing",
            plan.network.name
        )));
    };
    let held = host.addresses(link.index).await?;
    for gateway in &plan.gateway_addresses {
        if !held.contains(gateway) {
            return Err(mismatch(format!(
                "gateway device {device} does not hold {gateway}; it holds {held:?}"
            )));
        }
    }
    Ok(())
}

/// With `ipMasq`, the network's masquerade rules are in place.
fn check_masquerade(plan: &AttachmentPlan) -> Result<()> {
    if !plan.masquerade.is_empty() && !masquerade::installed(&plan.network.name) {
        return Err(mismatch(format!(
            "network {} asks for ipMasq but its masquerade rules are missing",
            plan.network.name
        )));
    }
    Ok(())
}

/// BIG TCP: each end of the pair has the configured GSO/GRO limits, where
/// the kernel takes them (ADD falls back to 64 KiB on one that does not).
fn check_big_tcp(plan: &AttachmentPlan, link: &LinkState) -> Result<()> {
    let Some(size) = plan.interface.big_tcp else {
        return Ok(());
    };
    if link.gso.tso_max_size.is_none_or(|most| most < size) {
        return Ok(());
    }
    for (name, value) in link.gso.named() {
        if value.is_some_and(|v| v != size) {
            return Err(mismatch(format!(
                "{} has {name} {}, \"bigTcp\" asks for {size}",
                link.name,
                value.unwrap_or_default()
            )));
        }
    }
    Ok(())
}

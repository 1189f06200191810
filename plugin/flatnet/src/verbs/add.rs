//! ADD: the veth pair made while IPAM runs, then the plan (`plan.rs`, from
//! the IPAM result) applied: addresses and routes in the pod, gateway, host
//! routes and neighbours, datapath attached and the pod made known to it;
//! undone on failure.

use std::fs::File;

use flatnet_common::{ENDPOINT_F_NONE, Endpoint};

use super::plan::{AttachmentPlan, HostAttach, InterfacePlan, PodIdentity};
use crate::after_answer::AfterAnswer;
use crate::config::NetConf;
use crate::delegate::Delegate;
use crate::error::{Error, Result};
use flatnet_cni::env::{CniEnv, Command};
use flatnet_cni::result::CniResult;
use flatnet_datapath::bpf::{
    self, AttachMode, Datapath, attach_filter, attach_host_veth, attach_xdp_then_filter,
    prepare_pod_for_xdp,
};
use flatnet_datapath::masquerade;
use flatnet_datapath::netlink::{Netlink, VethPair, set_sysctl};
use flatnet_datapath::node::first_packet::{Isolation, PodRecord};
use flatnet_datapath::node::{NodeNetwork, ensure_datapath, release_if_empty};
use flatnet_datapath::trace::mark;

/// What an ADD has done so far, so a failure can take it back.
#[derive(Default)]
struct Done {
    ipam: bool,
    /// The host veth's index and name.
    host_veth: Option<(u32, String)>,
    counter_slot: Option<u32>,
    in_datapath: bool,
    /// The slot whose policy ADD started (see `first_packet`).
    policy_slot: Option<u32>,
    /// The pod's record for the agent was (being) written.
    record: bool,
    /// The pod's hostPorts were (being) written.
    host_ports: bool,
}

/// The pod's namespace and name, when the runtime is kubelet's (CNI_ARGS).
fn pod_identity(env: &CniEnv) -> Option<PodIdentity> {
    let namespace = env.arg("K8S_POD_NAMESPACE").filter(|n| !n.is_empty())?;
    let name = env.arg("K8S_POD_NAME").filter(|n| !n.is_empty())?;
    Some(PodIdentity {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// What an ADD works with: the container's namespace, the host's netlink,
/// the IPAM plugin, and what has been done so far (for the rollback).
struct AddContext {
    netns: File,
    host: Netlink,
    ipam: Delegate,
    done: Done,
}

pub async fn add(
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    after: &mut AfterAnswer,
) -> Result<CniResult> {
    let netns_path = env
        .netns
        .as_deref()
        .ok_or_else(|| Error::invalid_env("CNI_NETNS", "is missing"))?;
    let mut ctx = AddContext {
        netns: super::open_cni_netns(netns_path)?,
        ipam: Delegate::find(conf.require_ipam()?, &env.path)?,
        host: Netlink::connect()?,
        done: Done::default(),
    };
    let interface = InterfacePlan::new(conf, &env.container_id, &env.ifname, netns_path);
    mark("parse, open netns, connect");
    let outcome = match plan(&mut ctx, env, conf, stdin, interface).await {
        Ok(plan) => apply(&plan, &mut ctx, after).await.map(|()| plan),
        Err(err) => Err(err),
    };
    match outcome {
        Ok(plan) => Ok(plan.result(conf.version, conf.prev_result.as_ref())),
        Err(err) => {
            rollback(conf, stdin, &mut ctx, after).await;
            Err(err)
        }
    }
}

/// The attachment's plan. The IPAM plugin runs while the veth pair (the
/// part of the plan known without it) is made: neither needs the other,
/// and its process start-up is most of an ADD's time.
async fn plan(
    ctx: &mut AddContext,
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    interface: InterfacePlan,
) -> Result<AttachmentPlan> {
    let running = ctx.ipam.start(Command::Add, stdin)?;
    // From here a failure gives the address back (DEL is idempotent).
    ctx.done.ipam = true;
    let veth = create_veth_pair(&interface, &ctx.netns, &ctx.host).await;
    // Waited for before anything else, so a rollback's IPAM DEL never
    // overtakes this ADD.
    let answer = running.wait();
    let host_link = veth?;
    ctx.done.host_veth = Some((host_link.index, host_link.name.clone()));
    let answer = answer?.ok_or_else(|| {
        flatnet_cni::error::Error::Delegate(format!(
            "IPAM plugin {} returned no result",
            ctx.ipam.name
        ))
    })?;
    let ipam_result = CniResult::from_value(&answer, "the IPAM result")?;
    let tcx = bpf::attach_mode() == AttachMode::Tcx;
    let plan = AttachmentPlan::for_add(conf, interface, &ipam_result, &ctx.ipam.name, tcx)?
        .for_pod(pod_identity(env));
    mark("IPAM ADD, with the veth pair made meanwhile");
    Ok(plan)
}

/// Everything after IPAM, from the plan alone: the pod side, then under the
/// network lock the datapath, gateway, routes, and the pod in the maps.
async fn apply(plan: &AttachmentPlan, ctx: &mut AddContext, after: &mut AfterAnswer) -> Result<()> {
    let Some((host_index, _)) = ctx.done.host_veth.clone() else {
        return Err(Error::kernel(
            format!("attaching {}", plan.interface.host_veth),
            "the veth pair was not made",
        ));
    };
    let pod = Netlink::connect_in(&ctx.netns)?;
    apply_pod_side(plan, &pod).await?;
    mark("pod side configured");

    let network = &plan.network;
    let datapath = Datapath::for_network(network)?;
    bpf::ensure_bpffs_at(datapath.root())?;
    refuse_other_agent_build(network, &datapath)?;
    let lock = ensure_datapath(network, &datapath, &ctx.host).await?;
    lock.note_activity();
    mark("bpffs, lock, datapath loaded");
    apply_host_side(plan, &ctx.host, host_index).await?;
    mark("gateway, host routes, neighbours");
    let counter_slot = datapath.claim_counter_slot(host_index)?;
    ctx.done.counter_slot = Some(counter_slot);
    let host_veth = &plan.interface.host_veth;
    match plan.host_attach {
        HostAttach::FilterThenTcx => {
            // The quick way now, the tcx link after the answer (see `after_answer`).
            attach_filter(&datapath, &ctx.host, host_index).await?;
            after.move_to_tcx(&network.name, &datapath, host_index, host_veth);
        }
        HostAttach::Xdp => {
            // The tc programs' tcx links after the answer too.
            attach_xdp_then_filter(&datapath, &ctx.host, host_index, host_veth).await?;
            after.move_xdp_mode_to_tcx(&network.name, &datapath, host_index, host_veth);
        }
        HostAttach::Now => {
            attach_host_veth(&datapath, network.mode, &ctx.host, host_index, host_veth).await?;
        }
    }
    if plan.host_attach == HostAttach::Xdp {
        prepare_pod_for_xdp(&datapath, &ctx.netns, &plan.interface.ifname, host_veth)?;
    }
    mark("datapath attached");
    let endpoint = Endpoint {
        host_ifindex: host_index,
        flags: ENDPOINT_F_NONE,
        pod_mac: plan.interface.pod_mac,
        host_mac: plan.interface.host_mac,
        counter_slot,
    };
    ctx.done.in_datapath = true;
    // NetworkPolicy from the first packet: a pod of a namespace with
    // policies starts isolated, before it is reachable at all.
    let isolation = Isolation::read(&network.name);
    if let (Some(pod), Some(isolation)) = (&plan.pod, &isolation) {
        let flags = isolation.start_flags(&pod.namespace);
        ctx.done.policy_slot = Some(counter_slot);
        datapath.start_pod_policy(counter_slot, host_veth, flags)?;
    }
    datapath.insert_pod(endpoint, &plan.endpoint_addresses, plan.shaping)?;
    if let (Some(pod), Some(_)) = (&plan.pod, &isolation) {
        // For the agent, who learns the address from the API only later.
        ctx.done.record = true;
        PodRecord {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            ips: plan.endpoint_addresses.clone(),
        }
        .write(&network.name, host_veth)?;
    }
    if !plan.host_ports.is_empty() {
        ctx.done.host_ports = true;
        datapath.put_host_ports(host_veth, &plan.host_ports)?;
        mark("hostPorts");
    }
    mark("pod inserted");
    // Last, so a failed ADD leaves the switches as it found them; as the
    // reference bridge plugin does, since the host forwards whatever the
    // datapath does not redirect (see docs/datapath.md, "A fresh node").
    plan.forwarding.ensure()?;
    Ok(())
}

/// One datapath build per node, the agent's: on a network flatnet-agent
/// manages, an ADD of another build must not pin its programs over the
/// agent's (the agent's policy and Service writes would then fail, and the
/// two would take turns). It fails instead, saying which builds meet; a
/// rolling upgrade's new agent installs its own plugin binaries.
fn refuse_other_agent_build(network: &NodeNetwork, datapath: &Datapath) -> Result<()> {
    // This build pinned (every ADD but an upgrade's): one stat, no listing.
    if datapath.is_loaded(network.mode)
        || !flatnet_datapath::node::markers::is_agent_managed(&network.name)
    {
        return Ok(());
    }
    match datapath.other_pinned_build() {
        Some(agents) => Err(Error::datapath(format!(
            "network {} is managed by flatnet-agent, whose datapath build {agents} is pinned under {}; this plugin is build {} and will not replace it: install the agent's plugin binaries (flatnet-agent --install-binaries does) or run an agent of this build",
            network.name,
            datapath.pin_dir().display(),
            bpf::DATAPATH_ID
        ))),
        None => Ok(()),
    }
}

/// Creates the pod's veth pair, host end up (the peer already in the pod's
/// namespace under its final name), replacing one a crashed ADD of this very
/// attachment left; returns the host end.
async fn create_veth_pair(
    interface: &InterfacePlan,
    netns: &File,
    host: &Netlink,
) -> Result<flatnet_datapath::netlink::LinkState> {
    if let Some(stale) = host.link_by_name(&interface.host_veth).await? {
        host.delete_link(stale.index).await?;
    }
    let pair = VethPair {
        host: &interface.host_veth,
        host_mac: interface.host_mac,
        peer: &interface.ifname,
        peer_mac: interface.pod_mac,
        mtu: interface.mtu,
        big_tcp: interface.big_tcp,
    };
    host.create_veth(&pair, netns).await?;
    host.link_by_name(&interface.host_veth)
        .await?
        .ok_or_else(|| {
            Error::kernel(
                format!("creating {}", interface.host_veth),
                "the new veth is not there",
            )
        })
}

/// Inside the pod: the plan's addresses, the interface up, its routes.
async fn apply_pod_side(plan: &AttachmentPlan, pod: &Netlink) -> Result<()> {
    let ifname = &plan.interface.ifname;
    let index = pod
        .link_by_name(ifname)
        .await?
        .ok_or_else(|| {
            Error::kernel(
                format!("configuring {ifname}"),
                "the interface is not in the container namespace",
            )
        })?
        .index;
    for ip in &plan.ips {
        pod.add_address(index, ip.address).await?;
    }
    pod.set_up(index).await?;
    for route in &plan.pod_routes {
        pod.add_route(route.dst, route.gw, index, None).await?;
    }
    Ok(())
}

/// On the host: the gateway device with the plan's gateway addresses, a
/// route and a permanent neighbour per pod address on the host veth
/// (`host_veth`), and masquerading when asked for.
async fn apply_host_side(plan: &AttachmentPlan, host: &Netlink, host_veth: u32) -> Result<()> {
    let network = &plan.network;
    let gateway_index = host
        .ensure_gateway_device(&network.gateway_device, &network.name)
        .await?;
    if plan.gateway_ipv6 {
        // The gateway device was created without IPv6 (no autoconf chatter):
        // turn it on for the IPv6 gateway, still without a link-local address.
        set_sysctl(
            &format!("net/ipv6/conf/{}/addr_gen_mode", network.gateway_device),
            "1",
        )?;
        set_sysctl(
            &format!("net/ipv6/conf/{}/disable_ipv6", network.gateway_device),
            "0",
        )?;
    }
    for gateway in &plan.gateway_addresses {
        host.add_address(gateway_index, *gateway).await?;
    }
    for route in &plan.host_routes {
        host.add_route(route.dst, None, host_veth, Some(route.src))
            .await?;
    }
    for (ip, mac) in &plan.neighbours {
        host.add_permanent_neighbour(host_veth, *ip, *mac).await?;
    }
    if !plan.masquerade.is_empty() {
        masquerade::ensure(&network.name, &plan.masquerade)?;
    }
    Ok(())
}

/// Takes back a failed ADD; every step is best effort and logged.
async fn rollback(conf: &NetConf, stdin: &[u8], ctx: &mut AddContext, after: &mut AfterAnswer) {
    let AddContext {
        host, ipam, done, ..
    } = ctx;
    // The ADD got as far as the datapath only with a usable pin root.
    let datapath = conf.pinned_datapath().ok();
    if let Some(datapath) = &datapath
        && done.in_datapath
        && let Some((index, _)) = &done.host_veth
        && let Err(e) = datapath.remove_pods(|ifindex| ifindex == *index)
    {
        eprintln!("flatnet: rollback: {e}");
    }
    if let Some(datapath) = &datapath
        && let Some(slot) = done.policy_slot
        && let Err(e) = datapath.clear_pod_policy(slot)
    {
        eprintln!("flatnet: rollback: {e}");
    }
    if done.record
        && let Some((_, name)) = &done.host_veth
    {
        PodRecord::remove(&conf.name, name);
    }
    if let Some(datapath) = &datapath
        && done.host_ports
        && let Some((_, name)) = &done.host_veth
        && let Err(e) = datapath.remove_host_ports(name)
    {
        eprintln!("flatnet: rollback: {e}");
    }
    // A slot not yet recorded with the pod is given back here.
    if let Some(datapath) = &datapath
        && !done.in_datapath
        && let Some(slot) = done.counter_slot
    {
        datapath.release_counter_slot(slot);
    }
    if let Some((index, name)) = &done.host_veth {
        if let Err(e) = host.delete_link(*index).await {
            eprintln!("flatnet: rollback: {e}");
        }
        // The veth's links went with it; their pins are ours.
        if let Some(datapath) = &datapath
            && let Err(e) = datapath.unpin_pod_links(name)
        {
            eprintln!("flatnet: rollback: {e}");
        }
    }
    if done.ipam
        && let Err(e) = ipam.run(Command::Del, stdin)
    {
        eprintln!("flatnet: rollback: releasing the address: {e}");
    }
    match release_if_empty(&conf.node_network(), host).await {
        Ok(Some((index, gateway))) => after.delete_link(index, &gateway),
        Ok(None) => {}
        Err(e) => eprintln!("flatnet: rollback: {e}"),
    }
}

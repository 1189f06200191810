//! ADD: veth pair, addresses and routes in the pod, host routes and
//! neighbours, datapath attached and the pod made known to it; undone on
//! failure.

use std::fs::File;
use std::net::IpAddr;
use std::path::Path;

use flatnet_common::{ENDPOINT_F_NONE, Endpoint, PROG_POD_XDP_PASS};
use ipnetwork::IpNetwork;

use crate::cni::config::{DatapathMode, NetConf};
use crate::cni::env::{CniEnv, Command};
use crate::cni::error::{Error, Result};
use crate::cni::result::{CniResult, Interface, IpConfig, Route};
use crate::cni::version::SpecVersion;
use crate::datapath::{self, Datapath};
use crate::delegate::Delegate;
use crate::link::{AttachmentNames, Netlink, format_mac, set_sysctl, set_tx_checksum};
use crate::masq;
use crate::netns;
use crate::network::{attach_host_veth, ensure_datapath, release_if_empty};
use crate::trace::mark;

/// What an ADD has done so far, so a failure can take it back.
#[derive(Default)]
struct Done {
    ipam: bool,
    host_veth: Option<u32>,
    counter_slot: Option<u32>,
    in_datapath: bool,
}

pub async fn add(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<CniResult> {
    let netns_path = env
        .netns
        .as_deref()
        .ok_or_else(|| Error::invalid_env("CNI_NETNS", "is missing"))?;
    let netns = netns::open_cni_netns(netns_path)?;
    let ipam = Delegate::find(conf.require_ipam()?, &env.path)?;
    let host = Netlink::connect()?;
    let mut done = Done::default();
    match add_steps(
        env, conf, stdin, netns_path, &netns, &ipam, &host, &mut done,
    )
    .await
    {
        Ok(result) => Ok(result),
        Err(err) => {
            rollback(conf, stdin, &ipam, &host, &done).await;
            Err(err)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn add_steps(
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    netns_path: &Path,
    netns: &File,
    ipam: &Delegate,
    host: &Netlink,
    done: &mut Done,
) -> Result<CniResult> {
    let names = AttachmentNames::new(&conf.name, &env.container_id, &env.ifname);
    // A MAC the runtime asked for (runtimeConfig/args/CNI_ARGS), else the hash's.
    let pod_mac = conf.mac.unwrap_or(names.pod_mac);
    mark("parse, open netns, connect");

    // The IPAM plugin runs while the veth pair is made: neither needs the
    // other, and its process start-up is most of an ADD's time.
    let running = ipam.start(Command::Add, stdin)?;
    // From here a failure gives the address back (DEL is idempotent).
    done.ipam = true;
    let veth = create_veth_pair(env, conf, netns, host, &names, pod_mac).await;
    // Waited for before anything else, so a rollback's IPAM DEL never
    // overtakes this ADD.
    let answer = running.wait();
    let host_link = veth?;
    done.host_veth = Some(host_link.index);
    let answer = answer?
        .ok_or_else(|| Error::Delegate(format!("IPAM plugin {} returned no result", ipam.name)))?;
    let ipam_result = CniResult::from_value(&answer, "the IPAM result")?;
    let ips = usable_ips(&ipam_result, &ipam.name)?;
    mark("IPAM ADD, with the veth pair made meanwhile");

    let pod = Netlink::connect_in(netns)?;
    let pod_index = pod
        .link_by_name(&env.ifname)
        .await?
        .ok_or_else(|| {
            Error::kernel(
                format!("configuring {}", env.ifname),
                "the interface is not in the container namespace",
            )
        })?
        .index;
    let routes = configure_pod(&pod, pod_index, &ips, &ipam_result.routes).await?;
    mark("pod side configured");

    // Host side, under the network lock: datapath, gateway, routes, the pod.
    let datapath = Datapath::new(&conf.name);
    datapath::ensure_bpffs()?;
    let _lock = ensure_datapath(conf, &datapath, host).await?;
    mark("bpffs, lock, datapath loaded");
    let gateway_index = host
        .ensure_gateway_device(&conf.gateway_device, &conf.name)
        .await?;
    if ips.iter().any(|ip| ip.address.is_ipv6()) {
        // The gateway device was created without IPv6 (no autoconf chatter):
        // turn it on for the IPv6 gateway, still without a link-local address.
        set_sysctl(
            &format!("net/ipv6/conf/{}/addr_gen_mode", conf.gateway_device),
            "1",
        )?;
        set_sysctl(
            &format!("net/ipv6/conf/{}/disable_ipv6", conf.gateway_device),
            "0",
        )?;
    }
    for ip in &ips {
        let gateway = ip.gateway.ok_or_else(|| missing_gateway(ip))?;
        let gateway_net = IpNetwork::new(gateway, ip.address.prefix())
            .map_err(|e| Error::config(e.to_string()))?;
        host.add_address(gateway_index, gateway_net).await?;
        let pod_ip = ip.address.ip();
        host.add_route(
            IpNetwork::from(pod_ip),
            None,
            host_link.index,
            Some(gateway),
        )
        .await?;
        host.add_permanent_neighbour(host_link.index, pod_ip, pod_mac)
            .await?;
    }
    if conf.ip_masq {
        let subnets: Vec<IpNetwork> = ips.iter().map(|ip| ip.address).collect();
        masq::ensure(&conf.name, &subnets)?;
    }
    mark("gateway, host routes, neighbours");
    let counter_slot = datapath.claim_counter_slot(host_link.index)?;
    done.counter_slot = Some(counter_slot);
    attach_host_veth(
        &datapath,
        conf.datapath,
        host,
        host_link.index,
        counter_slot,
    )
    .await?;
    if conf.datapath == DatapathMode::Xdp {
        // Frames XDP-redirected into a veth are only accepted once its NAPI
        // is on, which an XDP program on it turns on.
        pod.set_xdp(pod_index, datapath.program(PROG_POD_XDP_PASS)?.raw_fd()?)
            .await?;
        // Checksums must be complete when a frame enters XDP (see set_tx_checksum).
        set_tx_checksum(&names.host_veth, false)?;
        netns::within(netns, || set_tx_checksum(&env.ifname, false))??;
    }
    mark("datapath attached");
    let endpoint = Endpoint {
        host_ifindex: host_link.index,
        flags: ENDPOINT_F_NONE,
        pod_mac,
        host_mac: names.host_mac,
        counter_slot,
    };
    done.in_datapath = true;
    let addresses: Vec<IpAddr> = ips.iter().map(|ip| ip.address.ip()).collect();
    datapath.insert_pod(endpoint, &addresses)?;
    mark("pod inserted");

    let with_mtu = |mtu| {
        if conf.version >= SpecVersion::V1_1_0 {
            mtu
        } else {
            None
        }
    };
    Ok(CniResult {
        cni_version: conf.version.as_str().to_string(),
        interfaces: vec![
            Interface {
                name: names.host_veth.clone(),
                mac: Some(format_mac(&names.host_mac)),
                sandbox: None,
                mtu: with_mtu(conf.mtu),
                ..Default::default()
            },
            Interface {
                name: env.ifname.clone(),
                mac: Some(format_mac(&pod_mac)),
                sandbox: Some(netns_path.display().to_string()),
                mtu: with_mtu(conf.mtu),
                ..Default::default()
            },
        ],
        ips: ips
            .into_iter()
            .map(|ip| IpConfig {
                interface: Some(1),
                version: None,
                ..ip
            })
            .collect(),
        routes,
        dns: if conf.dns.is_empty() {
            ipam_result.dns
        } else {
            conf.dns.clone()
        },
    })
}

/// Creates the pod's veth pair, host end up (the peer already in the pod's
/// namespace under its final name), replacing one a crashed ADD of this very
/// attachment left; returns the host end.
async fn create_veth_pair(
    env: &CniEnv,
    conf: &NetConf,
    netns: &File,
    host: &Netlink,
    names: &AttachmentNames,
    pod_mac: crate::link::Mac,
) -> Result<crate::link::LinkState> {
    if let Some(stale) = host.link_by_name(&names.host_veth).await? {
        host.delete_link(stale.index).await?;
    }
    host.create_veth(
        &names.host_veth,
        names.host_mac,
        &env.ifname,
        pod_mac,
        netns,
        conf.mtu,
    )
    .await?;
    host.link_by_name(&names.host_veth).await?.ok_or_else(|| {
        Error::kernel(
            format!("creating {}", names.host_veth),
            "the new veth is not there",
        )
    })
}

/// The IPAM's addresses, each with the gateway the datapath needs.
fn usable_ips(result: &CniResult, ipam: &str) -> Result<Vec<IpConfig>> {
    if result.ips.is_empty() {
        return Err(Error::Delegate(format!(
            "IPAM plugin {ipam} returned no address"
        )));
    }
    if let Some(ip) = result.ips.iter().find(|ip| ip.gateway.is_none()) {
        return Err(missing_gateway(ip));
    }
    Ok(result.ips.clone())
}

fn missing_gateway(ip: &IpConfig) -> Error {
    Error::config(format!(
        "the IPAM result gives {} no gateway; set \"gateway\" in the IPAM range",
        ip.address
    ))
}

/// Inside the pod: addresses, interface up, the IPAM's routes and a default
/// route per family via its gateway. Returns the routes as the result
/// reports them.
async fn configure_pod(
    pod: &Netlink,
    pod_index: u32,
    ips: &[IpConfig],
    ipam_routes: &[Route],
) -> Result<Vec<Route>> {
    for ip in ips {
        pod.add_address(pod_index, ip.address).await?;
    }
    pod.set_up(pod_index).await?;
    let mut routes = ipam_routes.to_vec();
    for ip in ips {
        let family_has_default = routes
            .iter()
            .any(|r| r.is_default() && r.dst.is_ipv4() == ip.address.is_ipv4());
        if let (false, Some(gateway)) = (family_has_default, ip.gateway) {
            let any: IpAddr = if gateway.is_ipv4() {
                [0u8; 4].into()
            } else {
                [0u16; 8].into()
            };
            routes.push(Route::new(
                IpNetwork::new(any, 0).map_err(|e| Error::config(e.to_string()))?,
                Some(gateway),
            ));
        }
    }
    for route in &mut routes {
        // A route without "gw" goes via the gateway of its family.
        if route.gw.is_none() {
            route.gw = ips
                .iter()
                .find(|ip| ip.address.is_ipv4() == route.dst.is_ipv4())
                .and_then(|ip| ip.gateway);
        }
        pod.add_route(route.dst, route.gw, pod_index, None).await?;
    }
    Ok(routes)
}

/// Takes back a failed ADD; every step is best effort and logged.
async fn rollback(conf: &NetConf, stdin: &[u8], ipam: &Delegate, host: &Netlink, done: &Done) {
    let datapath = Datapath::new(&conf.name);
    if done.in_datapath
        && let Some(index) = done.host_veth
        && let Err(e) = datapath.remove_pods(|ifindex| ifindex == index)
    {
        eprintln!("flatnet: rollback: {e}");
    }
    // A slot not yet recorded with the pod is given back here.
    if !done.in_datapath
        && let Some(slot) = done.counter_slot
    {
        datapath.release_counter_slot(slot);
    }
    if let Some(index) = done.host_veth
        && let Err(e) = host.delete_link(index).await
    {
        eprintln!("flatnet: rollback: {e}");
    }
    if done.ipam
        && let Err(e) = ipam.run(Command::Del, stdin)
    {
        eprintln!("flatnet: rollback: releasing the address: {e}");
    }
    if let Err(e) = release_if_empty(conf, host).await {
        eprintln!("flatnet: rollback: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(ips: serde_json::Value) -> CniResult {
        CniResult::from_value(
            &serde_json::json!({"cniVersion": "1.0.0", "ips": ips}),
            "test",
        )
        .unwrap()
    }

    #[test]
    fn dual_stack_addresses_with_gateways_are_usable() {
        let r = result(serde_json::json!([
            {"address": "10.1.0.2/24", "gateway": "10.1.0.1"},
            {"address": "fd00::2/64", "gateway": "fd00::1"}
        ]));
        assert_eq!(usable_ips(&r, "x").unwrap().len(), 2);
    }

    #[test]
    fn an_address_without_gateway_or_no_address_is_refused() {
        let r = result(serde_json::json!([{"address": "10.1.0.2/24"}]));
        let err = usable_ips(&r, "x").unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("10.1.0.2/24"));
        assert_eq!(
            usable_ips(&result(serde_json::json!([])), "x")
                .unwrap_err()
                .code(),
            103
        );
    }
}

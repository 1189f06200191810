//! ADD: veth pair, addresses and routes in the pod, host route and
//! neighbour, datapath attached and endpoint inserted; undone on failure.

use std::net::IpAddr;
use std::path::Path;

use flatnet_common::{ENDPOINT_F_NONE, Endpoint, Ipv4Key};
use ipnetwork::IpNetwork;

use super::{ipv4_keys, release_network_if_empty};
use crate::cni::config::NetConf;
use crate::cni::env::{CniEnv, Command};
use crate::cni::error::{Error, Result};
use crate::cni::result::{CniResult, Interface, IpConfig, Route};
use crate::datapath::{self, Datapath};
use crate::delegate::Delegate;
use crate::link::{AttachmentNames, Netlink, format_mac};
use crate::lock::{self, Lock};
use crate::netns;
use crate::trace::mark;

/// What an ADD has done so far, so a failure can take it back.
#[derive(Default)]
struct Done {
    ipam: bool,
    host_veth: Option<u32>,
    endpoints: Vec<Ipv4Key>,
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
    netns: &std::fs::File,
    ipam: &Delegate,
    host: &Netlink,
    done: &mut Done,
) -> Result<CniResult> {
    let names = AttachmentNames::new(&conf.name, &env.container_id, &env.ifname);

    mark("parse, open netns, connect");
    let answer = ipam.run(Command::Add, stdin)?;
    mark("IPAM ADD");
    done.ipam = true;
    let answer = answer
        .ok_or_else(|| Error::Delegate(format!("IPAM plugin {} returned no result", ipam.name)))?;
    let ipam_result = CniResult::from_value(&answer, "the IPAM result")?;
    let ips = usable_ips(&ipam_result, &ipam.name)?;

    // A veth left by an ADD of this very attachment that crashed half way.
    if let Some(stale) = host.link_by_name(&names.host_veth).await? {
        host.delete_link(stale.index).await?;
    }
    host.create_veth(
        &names.host_veth,
        names.host_mac,
        &env.ifname,
        names.pod_mac,
        netns,
        conf.mtu,
    )
    .await?;
    let host_link = host.link_by_name(&names.host_veth).await?.ok_or_else(|| {
        Error::kernel(
            format!("creating {}", names.host_veth),
            "the new veth is not there",
        )
    })?;
    done.host_veth = Some(host_link.index);
    host.set_up(host_link.index).await?;
    mark("veth pair created");

    let routes = configure_pod(env, netns, &ips, &ipam_result.routes).await?;
    mark("pod side configured");

    // Host side: gateway device, route and neighbour, datapath.
    let datapath = Datapath::new(&conf.name);
    datapath::ensure_bpffs()?;
    let shared = Lock::shared(&lock::network(&conf.name))?;
    let _lock = if datapath.is_loaded() {
        shared
    } else {
        drop(shared);
        let exclusive = Lock::exclusive(&lock::network(&conf.name))?;
        if !datapath.is_loaded() {
            datapath.load()?;
        }
        exclusive
    };
    mark("bpffs, lock, datapath loaded");
    let gateway_index = host
        .ensure_gateway_device(&conf.gateway_device, &conf.name)
        .await?;
    for ip in &ips {
        let gateway = ip.gateway.ok_or_else(|| missing_gateway(ip))?;
        host.add_address(
            gateway_index,
            IpNetwork::new(gateway, ip.address.prefix())
                .map_err(|e| Error::config(e.to_string()))?,
        )
        .await?;
        let pod_ip = ip.address.ip();
        host.add_route(
            IpNetwork::from(pod_ip),
            None,
            host_link.index,
            Some(gateway),
        )
        .await?;
        host.add_permanent_neighbour(host_link.index, pod_ip, names.pod_mac)
            .await?;
    }
    mark("gateway, host route, neighbour");
    datapath.attach(&names.host_veth)?;
    mark("from_pod attached");
    let endpoint = Endpoint {
        host_ifindex: host_link.index,
        flags: ENDPOINT_F_NONE,
        pod_mac: names.pod_mac,
        host_mac: names.host_mac,
        _pad: [0; 4],
    };
    for (_, key) in ipv4_keys(&ips) {
        datapath.insert_endpoint(key, endpoint)?;
        done.endpoints.push(key);
    }
    mark("endpoint inserted");

    let with_mtu = |mtu| {
        if conf.version >= crate::cni::version::SpecVersion::V1_1_0 {
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
            },
            Interface {
                name: env.ifname.clone(),
                mac: Some(format_mac(&names.pod_mac)),
                sandbox: Some(netns_path.display().to_string()),
                mtu: with_mtu(conf.mtu),
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

/// The IPAM's addresses, checked against what this datapath can serve.
fn usable_ips(result: &CniResult, ipam: &str) -> Result<Vec<IpConfig>> {
    if result.ips.is_empty() {
        return Err(Error::Delegate(format!(
            "IPAM plugin {ipam} returned no address"
        )));
    }
    for ip in &result.ips {
        if ip.address.is_ipv6() {
            return Err(Error::config(format!(
                "IPAM plugin {ipam} returned the IPv6 address {}; this build's datapath serves IPv4 only: configure an IPv4 range",
                ip.address
            )));
        }
        if ip.gateway.is_none() {
            return Err(missing_gateway(ip));
        }
    }
    Ok(result.ips.clone())
}

fn missing_gateway(ip: &IpConfig) -> Error {
    Error::config(format!(
        "the IPAM result gives {} no gateway; set \"gateway\" in the IPAM range",
        ip.address
    ))
}

/// Inside the pod: interface up, addresses, the IPAM's routes and a default
/// route via the gateway. Returns the routes as the result reports them.
async fn configure_pod(
    env: &CniEnv,
    netns: &std::fs::File,
    ips: &[IpConfig],
    ipam_routes: &[Route],
) -> Result<Vec<Route>> {
    let pod = Netlink::connect_in(netns)?;
    let pod_link = pod.link_by_name(&env.ifname).await?.ok_or_else(|| {
        Error::kernel(
            format!("configuring {}", env.ifname),
            "the interface is not in the container namespace",
        )
    })?;
    for ip in ips {
        pod.add_address(pod_link.index, ip.address).await?;
    }
    pod.set_up(pod_link.index).await?;
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
        pod.add_route(route.dst, route.gw, pod_link.index, None)
            .await?;
    }
    Ok(routes)
}

/// Takes back a failed ADD; every step is best effort and logged.
async fn rollback(conf: &NetConf, stdin: &[u8], ipam: &Delegate, host: &Netlink, done: &Done) {
    let datapath = Datapath::new(&conf.name);
    if !done.endpoints.is_empty()
        && let Err(e) = datapath.remove_endpoints(|ip, _| done.endpoints.contains(ip))
    {
        eprintln!("flatnet: rollback: {e}");
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
    if let Err(e) = release_network_if_empty(conf, host).await {
        eprintln!("flatnet: rollback: {e}");
    }
}

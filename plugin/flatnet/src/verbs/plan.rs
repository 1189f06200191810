//! What an attachment is, worked out without touching the kernel: ADD
//! applies a plan, CHECK compares the kernel against one.
//!
//! ADD's plan comes from the configuration, the attachment's names and the
//! IPAM result; CHECK's from the same configuration and names and the
//! `prevResult` (the ADD's result), so both look for the same things: the
//! pod's interface and addresses, its routes (a default route per family via
//! that family's gateway unless IPAM gave one), the gateway addresses on the
//! gateway device, a host route and a permanent neighbour entry per pod
//! address on the host veth, and the addresses the datapath maps to the pod.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;

use crate::config::{DatapathMode, NetConf};
use crate::error::{Error, Result};
use flatnet_cni::error::Error as CniError;
use flatnet_cni::result::{CniResult, Interface, IpConfig, Route};
use flatnet_cni::version::SpecVersion;
use flatnet_datapath::bpf::Shaping;
use flatnet_datapath::netlink::{AttachmentNames, Forwarding, Mac, format_mac, parse_mac};
use flatnet_datapath::node::NodeNetwork;

/// The pod's veth pair: what ADD creates before IPAM has answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfacePlan {
    /// Host end: named and addressed from (network, container ID, ifname).
    pub host_veth: String,
    pub host_mac: Mac,
    /// Pod end, inside the container namespace.
    pub ifname: String,
    pub pod_mac: Mac,
    pub mtu: Option<u32>,
    /// GSO/GRO size for both ends (BIG TCP): the tc datapath only, since a
    /// veth with an XDP program cannot take GSO packets at all.
    pub big_tcp: Option<u32>,
    pub netns: PathBuf,
}

impl InterfacePlan {
    /// The veth pair of attachment (`container_id`, `ifname`) in `netns`:
    /// the pod MAC is the runtime's when it asked for one (runtimeConfig,
    /// args, CNI_ARGS), else the attachment's derived one.
    pub fn new(conf: &NetConf, container_id: &str, ifname: &str, netns: &Path) -> Self {
        let names = AttachmentNames::new(&conf.name, container_id, ifname);
        InterfacePlan {
            host_veth: names.host_veth,
            host_mac: names.host_mac,
            ifname: ifname.to_string(),
            pod_mac: conf.mac.unwrap_or(names.pod_mac),
            mtu: conf.mtu,
            big_tcp: conf.big_tcp.filter(|_| conf.datapath == DatapathMode::Tc),
            netns: netns.to_path_buf(),
        }
    }
}

/// A host route to one pod address, through the pod's host veth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoute {
    /// The pod address as a /32 or /128.
    pub dst: IpNetwork,
    /// Preferred source: the gateway of the address's range.
    pub src: IpAddr,
}

/// How the pod's program goes on its host veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostAttach {
    /// tc on a kernel with tcx: a cls_bpf filter now (one netlink request),
    /// moved onto a tcx link after the answer (see `after_answer`).
    FilterThenTcx,
    /// tc, attached now in the kind it keeps: no tcx on this kernel, or a
    /// pod whose egress the bandwidth plugin shapes (its `ingress` qdisc
    /// cannot sit beside clsact, so no tcx move either).
    Now,
    /// XDP on the host veth, and the pod's end prepared for it.
    Xdp,
}

impl HostAttach {
    /// The way for a network's `mode`, whether the kernel has tcx, and
    /// what the bandwidth plugin shapes.
    pub fn choose(mode: DatapathMode, tcx: bool, shaping: Shaping) -> Self {
        match mode {
            DatapathMode::Xdp => HostAttach::Xdp,
            DatapathMode::Tc if tcx && !shaping.egress => HostAttach::FilterThenTcx,
            DatapathMode::Tc => HostAttach::Now,
        }
    }
}

/// Who the pod is, when the runtime says (kubelet's CNI_ARGS): its policy
/// starts from its namespace's, and the agent gets a record of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
}

/// Everything of one attachment, host and pod side: what ADD applies with
/// nothing else at hand, and what CHECK compares.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachmentPlan {
    pub interface: InterfacePlan,
    /// The network on the node: name, gateway device, datapath mode, pin root.
    pub network: NodeNetwork,
    /// What the bandwidth plugin chained after flatnet shapes (left to the stack).
    pub shaping: Shaping,
    pub host_attach: HostAttach,
    pub pod: Option<PodIdentity>,
    /// Addresses of the pod's interface, each with its range's gateway.
    pub ips: Vec<IpConfig>,
    /// Routes inside the pod, each with its gateway (a route IPAM gave
    /// without one goes via its family's gateway).
    pub pod_routes: Vec<Route>,
    /// On the gateway device: each range's gateway with the range's prefix.
    pub gateway_addresses: Vec<IpNetwork>,
    /// On the host veth: a route to each pod address.
    pub host_routes: Vec<HostRoute>,
    /// On the host veth: a permanent neighbour entry per pod address.
    pub neighbours: Vec<(IpAddr, Mac)>,
    /// The pod's addresses, as the datapath maps them to it.
    pub endpoint_addresses: Vec<IpAddr>,
    /// The subnets to masquerade (`ipMasq`), if any.
    pub masquerade: Vec<IpNetwork>,
    /// The gateway device needs IPv6 turned on.
    pub gateway_ipv6: bool,
    /// The node forwards the pod's families (the host stack carries
    /// everything the datapath does not redirect).
    pub forwarding: Forwarding,
    /// DNS for the result: the configuration's, else IPAM's.
    pub dns: flatnet_cni::result::Dns,
    /// The pod's hostPorts (`runtimeConfig.portMappings`), in BPF.
    pub host_ports: Vec<flatnet_datapath::bpf::HostPort>,
}

impl AttachmentPlan {
    /// ADD's plan, from the IPAM plugin `ipam`'s result; `tcx`: the kernel
    /// has tcx links.
    pub fn for_add(
        conf: &NetConf,
        interface: InterfacePlan,
        ipam_result: &CniResult,
        ipam: &str,
        tcx: bool,
    ) -> Result<Self> {
        if ipam_result.ips.is_empty() {
            return Err(
                CniError::Delegate(format!("IPAM plugin {ipam} returned no address")).into(),
            );
        }
        let ips = ipam_result.ips.clone();
        let routes = with_default_routes(&ips, &ipam_result.routes)?;
        let dns = if conf.dns.is_empty() {
            ipam_result.dns.clone()
        } else {
            conf.dns.clone()
        };
        Self::build(conf, interface, ips, routes, dns, tcx)
    }

    /// CHECK's plan, from the ADD's result (`prevResult`): the addresses
    /// that name this interface (an earlier plugin's do not), its MAC when
    /// the result gives one, and the routes as the result lists them.
    pub fn for_check(
        conf: &NetConf,
        mut interface: InterfacePlan,
        prev: &CniResult,
        tcx: bool,
    ) -> Result<Self> {
        let ours = prev
            .interfaces
            .iter()
            .position(|i| i.name == interface.ifname && i.sandbox.is_some());
        if let Some(mac) = ours
            .and_then(|i| prev.interfaces[i].mac.as_deref())
            .and_then(parse_mac)
        {
            interface.pod_mac = mac;
        }
        // flatnet's own IPs always name its interface; one naming none is
        // an earlier plugin's (unless no interface of ours is listed at all).
        let ips: Vec<IpConfig> = prev
            .ips
            .iter()
            .filter(|ip| ip.interface == ours)
            .cloned()
            .collect();
        Self::build(
            conf,
            interface,
            ips,
            prev.routes.clone(),
            prev.dns.clone(),
            tcx,
        )
    }

    /// The plan of pod `pod` (None: the runtime did not say).
    pub fn for_pod(self, pod: Option<PodIdentity>) -> Self {
        AttachmentPlan { pod, ..self }
    }

    fn build(
        conf: &NetConf,
        interface: InterfacePlan,
        ips: Vec<IpConfig>,
        pod_routes: Vec<Route>,
        dns: flatnet_cni::result::Dns,
        tcx: bool,
    ) -> Result<Self> {
        // The plan's addresses are the pod interface's: which interface a
        // result numbers it is the result's business.
        let ips: Vec<IpConfig> = ips
            .into_iter()
            .map(|ip| IpConfig {
                interface: None,
                version: None,
                ..ip
            })
            .collect();
        let mut gateway_addresses = Vec::new();
        let mut host_routes = Vec::new();
        for ip in &ips {
            let gateway = ip.gateway.ok_or_else(|| missing_gateway(ip))?;
            gateway_addresses.push(
                IpNetwork::new(gateway, ip.address.prefix())
                    .map_err(|e| Error::config(e.to_string()))?,
            );
            host_routes.push(HostRoute {
                dst: IpNetwork::from(ip.address.ip()),
                src: gateway,
            });
        }
        let endpoint_addresses: Vec<IpAddr> = ips.iter().map(|ip| ip.address.ip()).collect();
        let mappings = conf
            .port_mappings
            .as_ref()
            .map(flatnet_cni::port_mappings::port_mappings)
            .transpose()?
            .unwrap_or_default();
        let host_ports = super::host_ports::plan(&mappings, &endpoint_addresses)?;
        Ok(AttachmentPlan {
            host_ports,
            network: conf.node_network(),
            shaping: conf.shaping,
            host_attach: HostAttach::choose(conf.datapath, tcx, conf.shaping),
            pod: None,
            neighbours: endpoint_addresses
                .iter()
                .map(|ip| (*ip, interface.pod_mac))
                .collect(),
            masquerade: if conf.ip_masq {
                ips.iter().map(|ip| ip.address).collect()
            } else {
                Vec::new()
            },
            gateway_ipv6: ips.iter().any(|ip| ip.address.is_ipv6()),
            forwarding: Forwarding::for_addresses(&endpoint_addresses),
            interface,
            pod_routes,
            gateway_addresses,
            host_routes,
            endpoint_addresses,
            ips,
            dns,
        })
    }

    /// ADD's result: the host veth and the pod's interface, the addresses
    /// (on the pod's interface), the routes and DNS; after `prev`'s, when
    /// an earlier plugin of a list reported something.
    pub fn result(&self, version: SpecVersion, prev: Option<&CniResult>) -> CniResult {
        // Interface MTUs are reported from 1.1.0 on.
        let mtu = self
            .interface
            .mtu
            .filter(|_| version >= SpecVersion::V1_1_0);
        let result = CniResult {
            cni_version: version.as_str().to_string(),
            interfaces: vec![
                Interface {
                    name: self.interface.host_veth.clone(),
                    mac: Some(format_mac(&self.interface.host_mac)),
                    sandbox: None,
                    mtu,
                    ..Default::default()
                },
                Interface {
                    name: self.interface.ifname.clone(),
                    mac: Some(format_mac(&self.interface.pod_mac)),
                    sandbox: Some(self.interface.netns.display().to_string()),
                    mtu,
                    ..Default::default()
                },
            ],
            ips: self
                .ips
                .iter()
                .map(|ip| IpConfig {
                    interface: Some(1),
                    version: None,
                    ..ip.clone()
                })
                .collect(),
            routes: self.pod_routes.clone(),
            dns: self.dns.clone(),
        };
        match prev {
            Some(prev) => result.after(prev),
            None => result,
        }
    }
}

/// IPAM's routes, plus a default route per family of `ips` that has none,
/// via that family's gateway; a route without a gateway gets its family's.
fn with_default_routes(ips: &[IpConfig], ipam_routes: &[Route]) -> Result<Vec<Route>> {
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
        if route.gw.is_none() {
            route.gw = ips
                .iter()
                .find(|ip| ip.address.is_ipv4() == route.dst.is_ipv4())
                .and_then(|ip| ip.gateway);
        }
    }
    Ok(routes)
}

fn missing_gateway(ip: &IpConfig) -> Error {
    Error::config(format!(
        "the IPAM result gives {} no gateway; set \"gateway\" in the IPAM range",
        ip.address
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(extra: serde_json::Value) -> NetConf {
        let mut value = json!({
            "cniVersion": "1.1.0",
            "name": "pods",
            "type": "flatnet",
            "ipam": {"type": "flatnet-ipam"},
        });
        for (key, v) in extra.as_object().cloned().unwrap_or_default() {
            value[key] = v;
        }
        NetConf::parse(value.to_string().as_bytes()).unwrap()
    }

    fn result(value: serde_json::Value) -> CniResult {
        let mut value = value;
        value["cniVersion"] = json!("1.0.0");
        CniResult::from_value(&value, "test").unwrap()
    }

    fn interface(conf: &NetConf) -> InterfacePlan {
        InterfacePlan::new(conf, "ctr1", "eth0", Path::new("/run/netns/p1"))
    }

    fn dual_stack() -> CniResult {
        result(json!({"ips": [
            {"address": "10.1.0.2/24", "gateway": "10.1.0.1"},
            {"address": "fd00::2/64", "gateway": "fd00::1"}
        ]}))
    }

    #[test]
    fn add_plans_addresses_routes_gateways_and_the_datapath_for_each_family() {
        let conf = conf(json!({"mtu": 1400, "ipMasq": true}));
        let plan =
            AttachmentPlan::for_add(&conf, interface(&conf), &dual_stack(), "x", true).unwrap();
        let routes: Vec<String> = plan
            .pod_routes
            .iter()
            .map(|r| format!("{} via {}", r.dst, r.gw.unwrap()))
            .collect();
        assert_eq!(routes, ["0.0.0.0/0 via 10.1.0.1", "::/0 via fd00::1"]);
        let gateways: Vec<String> = plan
            .gateway_addresses
            .iter()
            .map(|g| g.to_string())
            .collect();
        assert_eq!(gateways, ["10.1.0.1/24", "fd00::1/64"]);
        assert_eq!(plan.host_routes[0].dst.to_string(), "10.1.0.2/32");
        assert_eq!(plan.host_routes[1].dst.to_string(), "fd00::2/128");
        assert_eq!(plan.host_routes[1].src.to_string(), "fd00::1");
        assert_eq!(plan.neighbours.len(), 2);
        assert!(
            plan.neighbours
                .iter()
                .all(|(_, mac)| *mac == plan.interface.pod_mac)
        );
        assert_eq!(plan.endpoint_addresses.len(), 2);
        assert_eq!(plan.masquerade.len(), 2);
        assert!(plan.gateway_ipv6);
        assert!(plan.forwarding.ipv4 && plan.forwarding.ipv6);
        assert_eq!(plan.interface.mtu, Some(1400));
        assert!(plan.interface.host_veth.starts_with("fl"));
    }

    #[test]
    fn ipam_routes_keep_their_default_and_get_their_familys_gateway() {
        let conf = conf(json!({}));
        let ipam = result(json!({
            "ips": [{"address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.254"}, {"dst": "192.168.0.0/16"}]
        }));
        let plan = AttachmentPlan::for_add(&conf, interface(&conf), &ipam, "x", true).unwrap();
        let routes: Vec<String> = plan
            .pod_routes
            .iter()
            .map(|r| format!("{} via {}", r.dst, r.gw.unwrap()))
            .collect();
        // No second default route; the gateway-less route goes via 10.1.0.1.
        assert_eq!(
            routes,
            ["0.0.0.0/0 via 10.1.0.254", "192.168.0.0/16 via 10.1.0.1"]
        );
        assert!(!plan.gateway_ipv6);
        // Forwarding is planned for the pod's family only.
        assert!(plan.forwarding.ipv4 && !plan.forwarding.ipv6);
        assert!(plan.masquerade.is_empty());
    }

    #[test]
    fn an_address_without_gateway_or_no_address_is_refused() {
        let conf = conf(json!({}));
        let no_gateway = result(json!({"ips": [{"address": "10.1.0.2/24"}]}));
        let err =
            AttachmentPlan::for_add(&conf, interface(&conf), &no_gateway, "x", true).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("10.1.0.2/24"));
        let nothing = result(json!({"ips": []}));
        let err =
            AttachmentPlan::for_add(&conf, interface(&conf), &nothing, "x", true).unwrap_err();
        assert_eq!(err.code(), 103);
    }

    #[test]
    fn the_result_reports_both_interfaces_the_addresses_and_mtu_from_1_1_0() {
        let conf = conf(json!({"mtu": 1400, "dns": {"nameservers": ["10.96.0.10"]}}));
        let plan =
            AttachmentPlan::for_add(&conf, interface(&conf), &dual_stack(), "x", true).unwrap();
        let result = plan.result(SpecVersion::V1_1_0, None);
        assert_eq!(result.interfaces.len(), 2);
        assert_eq!(result.interfaces[1].name, "eth0");
        assert_eq!(
            result.interfaces[1].sandbox.as_deref(),
            Some("/run/netns/p1")
        );
        assert_eq!(result.interfaces[0].mtu, Some(1400));
        assert!(result.ips.iter().all(|ip| ip.interface == Some(1)));
        assert_eq!(result.dns.nameservers, ["10.96.0.10"]);
        let older = plan.result(SpecVersion::V1_0_0, None);
        assert_eq!(older.interfaces[0].mtu, None);
    }

    #[test]
    fn check_plans_what_add_planned_from_its_result() {
        let conf = conf(json!({"mtu": 1400}));
        let added =
            AttachmentPlan::for_add(&conf, interface(&conf), &dual_stack(), "x", true).unwrap();
        let prev = added.result(SpecVersion::V1_1_0, None);
        let checked = AttachmentPlan::for_check(&conf, interface(&conf), &prev, true).unwrap();
        assert_eq!(checked, added);
    }

    #[test]
    fn check_keeps_to_its_own_interface_and_mac() {
        let conf = conf(json!({}));
        // An earlier plugin's interface and address come first.
        let prev = result(json!({
            "interfaces": [
                {"name": "other0", "sandbox": "/run/netns/p1"},
                {"name": "flx", "mac": "02:00:00:00:00:01"},
                {"name": "eth0", "mac": "02:aa:bb:cc:dd:ee", "sandbox": "/run/netns/p1"}
            ],
            "ips": [
                {"address": "192.168.9.9/24", "gateway": "192.168.9.1", "interface": 0},
                {"address": "10.1.0.2/24", "gateway": "10.1.0.1", "interface": 2}
            ]
        }));
        let plan = AttachmentPlan::for_check(&conf, interface(&conf), &prev, true).unwrap();
        assert_eq!(
            plan.endpoint_addresses,
            ["10.1.0.2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            plan.interface.pod_mac,
            parse_mac("02:aa:bb:cc:dd:ee").unwrap()
        );
    }

    #[test]
    fn the_plan_says_how_the_program_goes_on_the_host_veth() {
        let shaped_egress = Shaping {
            ingress: false,
            egress: true,
        };
        let plain = Shaping::default();
        use HostAttach::*;
        assert_eq!(
            HostAttach::choose(DatapathMode::Tc, true, plain),
            FilterThenTcx
        );
        assert_eq!(HostAttach::choose(DatapathMode::Tc, false, plain), Now);
        assert_eq!(
            HostAttach::choose(DatapathMode::Tc, true, shaped_egress),
            Now
        );
        assert_eq!(HostAttach::choose(DatapathMode::Xdp, true, plain), Xdp);
    }

    #[test]
    fn the_plan_carries_what_apply_needs_of_the_configuration() {
        let conf = conf(json!({"bridge": "flgw7", "ipMasq": true, "datapath": "xdp",
            "runtimeConfig": {"bandwidth": {"ingressRate": 1000, "ingressBurst": 100}}}));
        let plan = AttachmentPlan::for_add(&conf, interface(&conf), &dual_stack(), "x", true)
            .unwrap()
            .for_pod(Some(PodIdentity {
                namespace: "ns".into(),
                name: "p".into(),
            }));
        assert_eq!(plan.network, conf.node_network());
        assert_eq!(plan.network.gateway_device, "flgw7");
        assert_eq!(plan.host_attach, HostAttach::Xdp);
        assert!(plan.shaping.ingress && !plan.shaping.egress);
        assert_eq!(plan.masquerade.len(), 2);
        assert_eq!(plan.pod.as_ref().map(|p| p.namespace.as_str()), Some("ns"));
    }
}

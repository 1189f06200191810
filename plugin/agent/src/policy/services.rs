//! Services as egress policy sees them. A pod sends to a ClusterIP; the
//! node's kube-proxy rewrites it to a backend only after flatnet's
//! `from_pod` has judged the packet. Kubernetes' own tests judge egress
//! against the backend (a Service as destination is allowed exactly when
//! its backend is), so the plan turns backends into ClusterIP entries: a
//! Service port is allowed through its ClusterIP when every one of its
//! backends is allowed on its target port. A Service with some backends
//! allowed and others not stays denied through its ClusterIP (kube-proxy
//! would pick one at random; allowing it would let the pod reach backends
//! its policy denies), and its allowed backends remain reachable directly.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::ports::{PortRange, PortSet, Protocol};
use super::table::{Allow, Table};

/// The label an EndpointSlice names its Service with.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One port of a Service's ClusterIPs and where it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendPort {
    pub protocol: Protocol,
    pub port: u16,
    /// Ready endpoints' (address, target port), sorted; empty when none is.
    pub backends: Vec<(IpAddr, u16)>,
}

/// A Service with ClusterIPs (not headless, not ExternalName).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend<'a> {
    /// The Service's name, for errors naming where an entry came from.
    pub name: &'a str,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<FrontendPort>,
}

/// The frontends of `services`, their backends from `slices` (matched by
/// namespace and the service-name label; a Service port's backends are the
/// slice ports of the same name and protocol, on endpoints whose `ready`
/// condition is true or unset).
pub fn frontends<'a>(services: &[&'a Service], slices: &[&'a EndpointSlice]) -> Vec<Frontend<'a>> {
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let (Some(namespace), Some(service)) = (
            slice.metadata.namespace.as_deref(),
            slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL)),
        ) else {
            continue;
        };
        by_service
            .entry((namespace, service.as_str()))
            .or_default()
            .push(slice);
    }
    services
        .iter()
        .filter_map(|service| {
            let name = service.metadata.name.as_deref()?;
            let namespace = service.metadata.namespace.as_deref()?;
            let spec = service.spec.as_ref()?;
            let cluster_ips: Vec<IpAddr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|ip| ip.parse().ok())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if cluster_ips.is_empty() {
                return None;
            }
            let slices = by_service
                .get(&(namespace, name))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let ports = spec
                .ports
                .iter()
                .flatten()
                .filter_map(|port| {
                    let protocol = Protocol::from_kube(port.protocol.as_deref())?;
                    let port_name = port.name.as_deref().unwrap_or("");
                    Some(FrontendPort {
                        protocol,
                        port: u16::try_from(port.port).ok()?,
                        backends: backends(slices, port_name, protocol),
                    })
                })
                .collect();
            Some(Frontend {
                name,
                cluster_ips,
                ports,
            })
        })
        .collect()
}

/// The ready endpoints of `slices` on their port named `port_name` of
/// `protocol`, sorted and without repeats.
fn backends(slices: &[&EndpointSlice], port_name: &str, protocol: Protocol) -> Vec<(IpAddr, u16)> {
    let mut out = Vec::new();
    for slice in slices {
        let Some(port) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && Protocol::from_kube(p.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            out.extend(
                endpoint
                    .addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .map(|ip| (ip, port)),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The ClusterIP entries an egress `table` earns: for each Service port
/// and ClusterIP, that port when the table allows every backend of the
/// ClusterIP's family (kube-proxy translates within a family) on its target
/// port, and there is at least one.
pub fn cluster_ip_allows<'a>(table: &Table, frontends: &[Frontend<'a>]) -> Vec<Allow<'a>> {
    let mut out = Vec::new();
    for frontend in frontends {
        for port in &frontend.ports {
            for ip in &frontend.cluster_ips {
                let mut backends = port
                    .backends
                    .iter()
                    .filter(|(backend, _)| backend.is_ipv4() == ip.is_ipv4())
                    .peekable();
                if backends.peek().is_none()
                    || !backends.all(|(backend, target)| {
                        table.allows(*backend, port.protocol.number(), *target)
                    })
                {
                    continue;
                }
                let Ok(cidr) = IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }) else {
                    continue;
                };
                out.push(Allow {
                    cidr,
                    except: Vec::new(),
                    ports: PortSet::of([PortRange::new(port.protocol, port.port, port.port)]),
                    policy: frontend.name,
                });
            }
        }
    }
    out
}

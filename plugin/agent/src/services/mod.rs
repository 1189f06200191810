//! Service state as a node's kube-proxy computes it: for each Service with
//! ClusterIPs, each port's backends on this node's view. A pure function of
//! the Services and EndpointSlices (unit-tested without root); NetworkPolicy
//! judges a ClusterIP by these backends (`policy::services`).
//!
//! Which endpoints, as kube-proxy chooses them: the ready ones (`ready`
//! unset counts as ready); when none is, the ones still serving while they
//! terminate; with `internalTrafficPolicy: Local`, only those on this node
//! (none there: the Service has no backend here); otherwise only those
//! topology hints keep for this node or its zone (`topology`). A Service port's backends
//! are its EndpointSlices' ports of the same name and protocol (so a named
//! `targetPort` is resolved per endpoint, as the slice controller did), each
//! endpoint address on that slice port.

pub mod by_service;
pub mod departures;
pub mod health;
pub mod nat;
pub mod plan;
pub mod ports;
mod service;
mod slice;
pub mod sync;
pub mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

pub use service::{Service, ServicePort, ServiceSpec, ServiceStatus, WatchedService};
pub use slice::{Endpoint, EndpointSlice, WatchedEndpointSlice};

use crate::protocol::Protocol;
pub use topology::Here;

/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Services with either label are not kube-proxy's to serve (another
/// proxy's, or headless by label): kube-proxy's informers select them
/// away, and so does flatnet.
const NOT_FOR_THIS_PROXY: [&str; 2] = [
    "service.kubernetes.io/service-proxy-name",
    "service.kubernetes.io/headless",
];

/// Whether an object with `labels` is not kube-proxy's to serve.
fn not_for_this_proxy(labels: &BTreeMap<String, String>) -> bool {
    NOT_FOR_THIS_PROXY.iter().any(|l| labels.contains_key(*l))
}
/// sessionAffinity ClientIP's default timeout (`timeoutSeconds`).
const DEFAULT_AFFINITY_SECS: u64 = 10_800;

/// One port of a Service's ClusterIPs and where it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendPort {
    /// The Service port's name ("" when it has one port and no name).
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// type NodePort or LoadBalancer: the port on every node address.
    pub node_port: Option<u16>,
    /// (address, target port) of the chosen endpoints, sorted; both
    /// families (a ClusterIP uses those of its own).
    pub backends: Vec<(IpAddr, u16)>,
    /// Those of this node's endpoints that `externalTrafficPolicy: Local`
    /// would use (chosen as above among this node's), sorted.
    pub local_backends: Vec<(IpAddr, u16)>,
}

/// A Service with ClusterIPs (not headless, not ExternalName).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// Sorted, both families.
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.externalIPs` and the load balancer's ingress IPs
    /// (`status.loadBalancer.ingress[].ip`, unless its `ipMode` is `Proxy`:
    /// then traffic must go through the load balancer), sorted: each
    /// serves the Service's ports as a ClusterIP does.
    pub external_ips: Vec<IpAddr>,
    /// sessionAffinity ClientIP: how long a client keeps its backend.
    pub affinity: Option<Duration>,
    /// `externalTrafficPolicy: Local`: clients outside the cluster reach
    /// only this node's endpoints and keep their address.
    pub external_local: bool,
    /// `spec.healthCheckNodePort` (a LoadBalancer with
    /// `externalTrafficPolicy: Local`): where load balancers ask whether
    /// this node has endpoints.
    pub health_check_node_port: Option<u16>,
    /// This node's ready endpoints (distinct addresses): what the health
    /// check counts. Serving-but-terminating ones do not count, as with
    /// kube-proxy: a load balancer should move away from a node whose
    /// endpoints are all going.
    pub local_ready_endpoints: usize,
    pub ports: Vec<FrontendPort>,
}

impl FrontendPort {
    /// The backends of `cluster_ip`'s family.
    pub fn backends_for(&self, cluster_ip: IpAddr) -> impl Iterator<Item = &(IpAddr, u16)> {
        self.backends
            .iter()
            .filter(move |(backend, _)| backend.is_ipv4() == cluster_ip.is_ipv4())
    }
}

/// The frontends of `services` with their backends from `slices` (matched
/// by namespace and the service-name label), as seen from `here` (for
/// `internalTrafficPolicy: Local` and topology hints).
pub fn frontends<'a>(
    services: &[&'a Service],
    slices: &[&'a EndpointSlice],
    here: Here<'_>,
) -> Vec<Frontend<'a>> {
    let node = here.node;
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        // kube-proxy's informers select slices labelled so away too (a
        // slice labelled headless stops serving its Service).
        if slice.not_for_this_proxy {
            continue;
        }
        let Some(service) = slice.service_name.as_deref() else {
            continue;
        };
        by_service
            .entry((&*slice.namespace, service))
            .or_default()
            .push(slice);
    }
    services
        .iter()
        .filter_map(|service| {
            let (namespace, name) = (&*service.namespace, &*service.name);
            let spec = service.spec.as_ref()?;
            if spec.type_.as_deref() == Some("ExternalName") || service.not_for_this_proxy {
                return None;
            }
            let cluster_ips: Vec<IpAddr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|ip| ip.parse().ok())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if cluster_ips.is_empty() {
                return None;
            }
            let ingress = service
                .status
                .as_ref()
                .and_then(|status| status.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter(|ingress| ingress.ip_mode.as_deref() != Some("Proxy"))
                .filter_map(|ingress| ingress.ip.as_deref());
            let external_ips: Vec<IpAddr> = spec
                .external_ips
                .iter()
                .flatten()
                .map(String::as_str)
                .chain(ingress)
                .filter_map(|ip| ip.parse().ok())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
                let seconds = spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .and_then(|s| u64::try_from(s).ok())
                    .unwrap_or(DEFAULT_AFFINITY_SECS);
                Duration::from_secs(seconds)
            });
            let local_only = spec.internal_traffic_policy.as_deref() == Some("Local");
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
                    let port_name = port.name.clone().unwrap_or_default();
                    let local_backends = backends(slices, &port_name, protocol, Some(node), here);
                    let backends = backends(
                        slices,
                        &port_name,
                        protocol,
                        local_only.then_some(node),
                        here,
                    );
                    Some(FrontendPort {
                        name: port_name,
                        protocol,
                        port: u16::try_from(port.port).ok()?,
                        node_port: port.node_port.and_then(|p| u16::try_from(p).ok()),
                        backends,
                        local_backends,
                    })
                })
                .collect();
            Some(Frontend {
                namespace,
                name,
                cluster_ips,
                external_ips,
                affinity,
                external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                local_ready_endpoints: local_ready_endpoints(slices, node),
                health_check_node_port: spec
                    .health_check_node_port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p != 0),
                ports,
            })
        })
        .collect()
}

/// The addresses of `nodes` NodePorts are served on: each node's
/// (InternalIPs), only those in `only` when it names CIDRs; sorted.
pub fn nodeport_addresses(
    nodes: &[crate::peers::Node],
    only: &[ipnetwork::IpNetwork],
) -> Vec<IpAddr> {
    nodes
        .iter()
        .flat_map(|node| node.addresses.iter().copied())
        .filter(|address| only.is_empty() || only.iter().any(|cidr| cidr.contains(*address)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The distinct addresses of `slices`' ready endpoints on `node`.
fn local_ready_endpoints(slices: &[&EndpointSlice], node: &str) -> usize {
    slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.node_name.as_deref() == Some(node) && use_of(e) == Use::Ready)
        .flat_map(|e| e.addresses.iter())
        .collect::<BTreeSet<_>>()
        .len()
}

/// What kube-proxy makes of an endpoint's conditions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Ready,
    /// Serving while terminating: only when no endpoint is ready.
    Fallback,
    No,
}

fn use_of(endpoint: &Endpoint) -> Use {
    let conditions = endpoint.conditions.as_ref();
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    match (ready, serving && terminating) {
        (true, _) => Use::Ready,
        (false, true) => Use::Fallback,
        (false, false) => Use::No,
    }
}

/// The endpoints of `slices` on their port named `port_name` of
/// `protocol` that kube-proxy would use (only those on `local_node` when
/// given; otherwise narrowed by topology hints as seen from `here`),
/// sorted and without repeats.
fn backends(
    slices: &[&EndpointSlice],
    port_name: &str,
    protocol: Protocol,
    local_node: Option<&str>,
    here: Here<'_>,
) -> Vec<(IpAddr, u16)> {
    let mut candidates: Vec<(&Endpoint, u16, Use)> = Vec::new();
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
        for endpoint in slice.endpoints.iter().flatten() {
            if local_node.is_some_and(|node| endpoint.node_name.as_deref() != Some(node)) {
                continue;
            }
            candidates.push((endpoint, port, use_of(endpoint)));
        }
    }
    let ready = || candidates.iter().filter(|(_, _, used)| *used == Use::Ready);
    // Hints shape cluster-wide traffic only (kube-proxy: not the
    // node-local policies).
    let mode = match local_node {
        None => topology::mode(ready().map(|(endpoint, _, _)| *endpoint), here),
        Some(_) => None,
    };
    let addresses = |chosen: &mut dyn Iterator<Item = &(&Endpoint, u16, Use)>| {
        chosen
            .flat_map(|(endpoint, port, _)| endpoint.addresses.iter().map(move |ip| (*ip, *port)))
            .collect::<BTreeSet<_>>()
    };
    let chosen = addresses(
        &mut ready().filter(|(endpoint, _, _)| topology::serves_here(endpoint, mode, here)),
    );
    let chosen = if chosen.is_empty() {
        addresses(
            &mut candidates
                .iter()
                .filter(|(_, _, used)| *used == Use::Fallback),
        )
    } else {
        chosen
    };
    chosen.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const NODE: &str = "node-1";

    fn here(node: &str) -> Here<'_> {
        Here { node, zone: None }
    }

    fn service(spec: Value) -> Service {
        serde_json::from_value(
            json!({"metadata": {"namespace": "ns", "name": "web"}, "spec": spec}),
        )
        .unwrap()
    }

    fn slice(name: &str, service: &str, ports: Value, endpoints: Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": ports, "endpoints": endpoints
        }))
        .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn one(service: &Service, slices: &[EndpointSlice]) -> Vec<Frontend<'static>> {
        // Leaked for the test's 'static borrows; a test process is short.
        let service: &'static Service = Box::leak(Box::new(service.clone()));
        let slices: &'static [EndpointSlice] = Box::leak(slices.to_vec().into_boxed_slice());
        let slices: Vec<&EndpointSlice> = slices.iter().collect();
        frontends(&[service], &slices, here(NODE))
    }

    #[test]
    fn topology_hints_narrow_cluster_traffic_but_not_node_local_traffic() {
        let endpoints = json!([
            {"addresses": ["10.0.0.1"], "nodeName": NODE, "hints": {"forZones": [{"name": "a"}]}},
            {"addresses": ["10.0.0.2"], "nodeName": "node-2", "hints": {"forZones": [{"name": "b"}]}}
        ]);
        let slices = [slice("web-a", "web", json!([{"port": 80}]), endpoints)];
        let slices: Vec<&EndpointSlice> = slices.iter().collect();
        let cluster = service(json!({
            "clusterIP": "10.96.0.10", "trafficDistribution": "PreferSameZone",
            "ports": [{"port": 80}]
        }));
        let backends = |svc: &Service, here: Here<'_>| {
            frontends(&[svc], &slices, here)[0].ports[0]
                .backends
                .clone()
        };
        let zone_b = Here {
            node: "node-3",
            zone: Some("b"),
        };
        assert_eq!(backends(&cluster, zone_b), [(ip("10.0.0.2"), 80)]);
        // No endpoint for zone c: every one.
        let zone_c = Here {
            node: "node-3",
            zone: Some("c"),
        };
        assert_eq!(backends(&cluster, zone_c).len(), 2);
        // internalTrafficPolicy Local: this node's own, whatever the hints.
        let local = service(json!({
            "clusterIP": "10.96.0.10", "internalTrafficPolicy": "Local",
            "ports": [{"port": 80}]
        }));
        let node_in_b = Here {
            node: NODE,
            zone: Some("b"),
        };
        assert_eq!(backends(&local, node_in_b), [(ip("10.0.0.1"), 80)]);
    }

    #[test]
    fn named_target_ports_resolve_per_slice_and_families_stay_apart() {
        let svc = service(json!({
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd96::a"],
            "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                      {"name": "dns", "port": 53, "protocol": "UDP"}]
        }));
        let slices = [
            // Two versions of the Deployment: "http" is 8080 in one, 9090 in the other.
            slice(
                "web-a",
                "web",
                json!([{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
                json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}]),
            ),
            slice(
                "web-b",
                "web",
                json!([{"name": "http", "port": 9090}]),
                json!([{"addresses": ["fd00::3"]}]),
            ),
            // Another Service's slice.
            slice(
                "other",
                "other",
                json!([{"name": "http", "port": 1}]),
                json!([{"addresses": ["10.9.9.9"]}]),
            ),
        ];
        let found = one(&svc, &slices);
        assert_eq!(found.len(), 1);
        let web = &found[0];
        assert_eq!(web.cluster_ips, vec![ip("10.96.0.10"), ip("fd96::a")]);
        assert_eq!(web.affinity, None);
        assert_eq!(
            web.ports[0].backends,
            vec![
                (ip("10.0.0.1"), 8080),
                (ip("10.0.0.2"), 8080),
                (ip("fd00::3"), 9090)
            ]
        );
        assert_eq!(
            web.ports[0].backends_for(ip("fd96::a")).collect::<Vec<_>>(),
            vec![&(ip("fd00::3"), 9090)]
        );
        assert_eq!(web.ports[1].protocol, Protocol::Udp);
        assert_eq!(
            web.ports[1].backends,
            vec![(ip("10.0.0.1"), 5353), (ip("10.0.0.2"), 5353)]
        );
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let svc = service(json!({"clusterIP": "10.96.0.20", "ports": [{"port": 80}]}));
        let endpoints = |ready_one: bool| {
            json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": ready_one, "serving": ready_one, "terminating": false}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": true}}
            ])
        };
        let with = |ready_one| {
            one(
                &svc,
                &[slice(
                    "s",
                    "web",
                    json!([{"port": 8080}]),
                    endpoints(ready_one),
                )],
            )
        };
        assert_eq!(
            with(true)[0].ports[0].backends,
            vec![(ip("10.0.0.1"), 8080)]
        );
        assert_eq!(
            with(false)[0].ports[0].backends,
            vec![(ip("10.0.0.2"), 8080)]
        );
    }

    #[test]
    fn internal_traffic_policy_local_keeps_this_nodes_endpoints() {
        let svc = service(
            json!({"clusterIP": "10.96.0.30", "internalTrafficPolicy": "Local",
                                 "ports": [{"port": 80}]}),
        );
        let slices = [slice(
            "s",
            "web",
            json!([{"port": 8080}]),
            json!([
                {"addresses": ["10.0.0.1"], "nodeName": NODE},
                {"addresses": ["10.0.1.1"], "nodeName": "node-2"}
            ]),
        )];
        assert_eq!(
            one(&svc, &slices)[0].ports[0].backends,
            vec![(ip("10.0.0.1"), 8080)]
        );
        let elsewhere = [slice(
            "s",
            "web",
            json!([{"port": 8080}]),
            json!([
                {"addresses": ["10.0.1.1"], "nodeName": "node-2"}
            ]),
        )];
        assert!(one(&svc, &elsewhere)[0].ports[0].backends.is_empty());
    }

    #[test]
    fn services_labelled_for_another_proxy_or_headless_are_left_alone() {
        let slices = [slice(
            "web-1",
            "web",
            json!([{"port": 8080}]),
            json!([{"addresses": ["10.42.0.5"]}]),
        )];
        let slices: Vec<&EndpointSlice> = slices.iter().collect();
        for label in NOT_FOR_THIS_PROXY {
            let labelled: Service = serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "web", "labels": {label: "foo-bar"}},
                "spec": {"clusterIP": "10.96.0.7", "ports": [{"port": 80}]}
            }))
            .unwrap();
            assert!(
                frontends(&[&labelled], &slices, here("n1")).is_empty(),
                "{label}"
            );
        }
        let plain = service(json!({"clusterIP": "10.96.0.7", "ports": [{"port": 80}]}));
        assert_eq!(frontends(&[&plain], &slices, here("n1")).len(), 1);
        // A slice with either label is not the proxy's either: the upstream
        // spec labels a Service's only slice headless and expects the
        // Service to stop answering.
        for label in NOT_FOR_THIS_PROXY {
            let labelled: EndpointSlice = serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "web-1",
                             "labels": {"kubernetes.io/service-name": "web", label: ""}},
                "addressType": "IPv4", "ports": [{"port": 8080}],
                "endpoints": [{"addresses": ["10.42.0.5"]}]
            }))
            .unwrap();
            assert!(labelled.not_for_this_proxy);
            let web = &frontends(&[&plain], &[&labelled], here("n1"))[0];
            assert!(web.ports[0].backends.is_empty(), "{label}");
        }
    }

    #[test]
    fn the_health_check_counts_this_nodes_ready_endpoints_only() {
        let svc = service(json!({"clusterIP": "10.96.0.7", "type": "LoadBalancer",
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
            "ports": [{"port": 80, "nodePort": 30080}]}));
        let endpoints = |ready: bool| {
            json!([
                {"addresses": ["10.42.0.5"], "nodeName": "n1",
                 "conditions": {"ready": ready, "serving": true, "terminating": !ready}},
                {"addresses": ["10.42.1.5"], "nodeName": "n2"}
            ])
        };
        for (ready, expected) in [(true, 1), (false, 0)] {
            let slices = [slice(
                "web-1",
                "web",
                json!([{"port": 8080}]),
                endpoints(ready),
            )];
            let slices: Vec<&EndpointSlice> = slices.iter().collect();
            let web = &frontends(&[&svc], &slices, here("n1"))[0];
            assert_eq!(web.local_ready_endpoints, expected, "ready: {ready}");
            // Terminating but serving still carries this node's traffic.
            assert_eq!(web.ports[0].local_backends.len(), 1);
        }
    }

    #[test]
    fn external_ips_load_balancer_ips_and_node_ports() {
        let mut lb = service(json!({
            "type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "externalIPs": ["203.0.113.10", "not-an-address"],
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]
        }));
        lb.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [
            {"ip": "198.51.100.7"}, {"ip": "198.51.100.8", "ipMode": "Proxy"},
            {"hostname": "lb.example"}
        ]}}))
        .unwrap();
        let web = &one(&lb, &[])[0];
        // The Proxy-mode ingress is the load balancer's to reach.
        assert_eq!(
            web.external_ips,
            vec![ip("198.51.100.7"), ip("203.0.113.10")]
        );
        assert_eq!(web.ports[0].node_port, Some(30080));
        let plain = service(json!({"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}));
        assert_eq!(one(&plain, &[])[0].ports[0].node_port, None);
    }

    #[test]
    fn node_ports_on_every_node_address_or_those_asked_for() {
        let node = |name: &str, addresses: &[&str]| crate::peers::Node {
            name: name.into(),
            addresses: addresses.iter().map(|a| ip(a)).collect(),
            pod_cidrs: Vec::new(),
            zone: None,
        };
        let nodes = [
            node("a", &["172.30.0.2", "fd30::2"]),
            node("b", &["192.168.5.3"]),
        ];
        assert_eq!(
            nodeport_addresses(&nodes, &[]),
            vec![ip("172.30.0.2"), ip("192.168.5.3"), ip("fd30::2")]
        );
        let only: Vec<ipnetwork::IpNetwork> = vec!["172.30.0.0/16".parse().unwrap()];
        assert_eq!(nodeport_addresses(&nodes, &only), vec![ip("172.30.0.2")]);
    }

    #[test]
    fn session_affinity_headless_and_external_names() {
        let sticky = service(
            json!({"clusterIP": "10.96.0.40", "sessionAffinity": "ClientIP",
                                    "ports": [{"port": 80}]}),
        );
        assert_eq!(
            one(&sticky, &[])[0].affinity,
            Some(Duration::from_secs(10_800))
        );
        let short = service(
            json!({"clusterIP": "10.96.0.41", "sessionAffinity": "ClientIP",
                                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                                   "ports": [{"port": 80}]}),
        );
        assert_eq!(one(&short, &[])[0].affinity, Some(Duration::from_secs(60)));
        let headless = service(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        assert!(one(&headless, &[]).is_empty());
        let external = service(json!({"type": "ExternalName", "externalName": "example.org"}));
        assert!(one(&external, &[]).is_empty());
    }
}

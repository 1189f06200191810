//! The synthetic cluster of one size, as the API server serves its
//! objects: nodes with pod CIDRs, namespaces, pods (10 replicas of 10 apps
//! per namespace, 30 per node), Services with one EndpointSlice each (an
//! app's 10 pods) and NetworkPolicies (`flatnet_agent::policy::scale_fixture`,
//! the generator of the agent's own scale test). Pure: the same size gives
//! the same objects, for the stub and the real API server alike.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::{Value, json};

use crate::kube_stub::{Kind, api_namespace, api_pod};

/// Pods of one app in one namespace (a Deployment's replicas), apps per
/// namespace, pods per node.
pub const REPLICAS: usize = 10;
pub const APPS: usize = 10;
pub const PODS_PER_NODE: usize = 30;
const TIERS: [&str; 4] = ["web", "api", "db", "worker"];
/// The port every app serves, named as the policies name it.
pub const APP_PORT: u16 = 8080;
const METRICS_PORT: u16 = 9090;

/// A cluster's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub name: &'static str,
    pub nodes: usize,
    pub pods: usize,
    pub services: usize,
    pub policies: usize,
}

impl Size {
    pub fn namespaces(&self) -> usize {
        self.pods / (REPLICAS * APPS)
    }

    /// Endpoints of all Services (each an app's replicas).
    pub fn endpoints(&self) -> usize {
        self.services * REPLICAS
    }
}

/// The five sizes, the largest the issue's: 5,000 nodes, 150,000 pods,
/// 10,000 Services with 100,000 endpoints, 30,000 NetworkPolicies.
pub const SIZES: [Size; 5] = [
    size("xs", 50, 1_500, 100, 300),
    size("s", 250, 7_500, 500, 1_500),
    size("m", 1_000, 30_000, 2_000, 6_000),
    size("l", 2_500, 75_000, 5_000, 15_000),
    size("xl", 5_000, 150_000, 10_000, 30_000),
];

const fn size(
    name: &'static str,
    nodes: usize,
    pods: usize,
    services: usize,
    policies: usize,
) -> Size {
    Size {
        name,
        nodes,
        pods,
        services,
        policies,
    }
}

pub fn size_named(name: &str) -> Option<Size> {
    SIZES.iter().copied().find(|s| s.name == name)
}

/// Node `n`: `scale-node-<n>`, underlay address 172.31.<n/256>.<n%256>
/// (off the simulated cluster's 172.30.0.0/16), pod CIDR
/// 10.<64 + n/256>.<n%256>.0/24 (off the local node's 10.244.0.0/16).
pub fn node_name(n: usize) -> String {
    format!("scale-node-{n}")
}

fn node_address(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 31, (n / 256) as u8, (n % 256) as u8)
}

fn pod_cidr(n: usize) -> String {
    format!("10.{}.{}.0/24", 64 + n / 256, n % 256)
}

pub fn node(n: usize) -> Value {
    let name = node_name(n);
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": pod_cidr(n), "podCIDRs": [pod_cidr(n)]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": node_address(n).to_string()},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    })
}

/// Namespace `ns`: `scale-ns-<ns>`, labelled with an environment and a
/// team as the policies select them.
pub fn namespace_name(ns: usize) -> String {
    format!("scale-ns-{ns}")
}

pub fn namespace(ns: usize) -> Value {
    let env = if ns.is_multiple_of(2) { "prod" } else { "dev" };
    api_namespace(
        &namespace_name(ns),
        json!({"env": env, "team": format!("team-{}", ns % 5)}),
    )
}

/// Where pod `i` is: its namespace, app and replica.
fn place(i: usize) -> (usize, usize, usize) {
    (i / (APPS * REPLICAS), (i / REPLICAS) % APPS, i % REPLICAS)
}

/// Pod `i` of a cluster of `size`: on node `i % nodes`, at the
/// `i / nodes`-th address of its pod CIDR.
pub fn pod_address(size: &Size, i: usize) -> IpAddr {
    let n = i % size.nodes;
    let host = 2 + i / size.nodes;
    IpAddr::V4(Ipv4Addr::new(
        10,
        (64 + n / 256) as u8,
        (n % 256) as u8,
        host as u8,
    ))
}

pub fn pod_name(i: usize) -> String {
    let (_, app, replica) = place(i);
    format!("app-{app}-{replica}-{i}")
}

pub fn pod(size: &Size, i: usize) -> Value {
    let (ns, app, _) = place(i);
    let labels = json!({"app": format!("app-{app}"), "tier": TIERS[app % TIERS.len()]});
    let containers = json!([{"name": "app", "image": "registry.invalid/app", "ports": [
        {"name": "http", "containerPort": APP_PORT},
        {"name": "metrics", "containerPort": METRICS_PORT}
    ]}]);
    api_pod(
        &namespace_name(ns),
        &pod_name(i),
        &node_name(i % size.nodes),
        pod_address(size, i),
        labels,
        containers,
    )
}

/// Service `s` fronts app `s % APPS` of namespace `s / APPS`: its
/// ClusterIP is the `s`-th address of 10.96.0.0/12 after the first 16.
fn service_place(s: usize) -> (usize, usize) {
    (s / APPS, s % APPS)
}

pub fn cluster_ip(s: usize) -> Ipv4Addr {
    let offset = (s + 16) as u32;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + offset)
}

pub fn service_name(s: usize) -> String {
    format!("svc-{s}")
}

pub fn service(s: usize) -> Value {
    let (ns, app) = service_place(s);
    json!({
        "metadata": {"namespace": namespace_name(ns), "name": service_name(s)},
        "spec": {
            "type": "ClusterIP", "clusterIP": cluster_ip(s).to_string(),
            "clusterIPs": [cluster_ip(s).to_string()], "ipFamilies": ["IPv4"],
            "selector": {"app": format!("app-{app}")},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]
        }
    })
}

/// The pods behind Service `s`.
pub fn service_pods(s: usize) -> impl Iterator<Item = usize> {
    let (ns, app) = service_place(s);
    let first = (ns * APPS + app) * REPLICAS;
    first..first + REPLICAS
}

/// Service `s`'s EndpointSlice with the pods in `live` (the others are
/// gone), stamped with `trigger` as the EndpointSlice controller stamps
/// the change behind it (RFC 3339).
pub fn endpoint_slice(size: &Size, s: usize, live: impl Fn(usize) -> bool, trigger: &str) -> Value {
    let (ns, _) = service_place(s);
    let endpoints: Vec<Value> = service_pods(s)
        .filter(|i| live(*i))
        .map(|i| {
            json!({
                "addresses": [pod_address(size, i).to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": node_name(i % size.nodes),
                "targetRef": {"kind": "Pod", "namespace": namespace_name(ns), "name": pod_name(i)}
            })
        })
        .collect();
    json!({
        "metadata": {
            "namespace": namespace_name(ns), "name": format!("{}-scale", service_name(s)),
            "labels": {"kubernetes.io/service-name": service_name(s),
                       "endpointslice.kubernetes.io/managed-by": "flatnet-scale"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": trigger}
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": APP_PORT, "protocol": "TCP"}]
    })
}

/// Policy `p`, in namespace `p % namespaces`; `generation` changes its
/// port, as a churned policy's update does.
pub fn policy(size: &Size, p: usize, generation: u16) -> Value {
    let namespaces = size.namespaces();
    let spec = flatnet_agent::policy::scale_fixture::policy_spec(
        p,
        namespaces,
        APPS,
        "10.244.0.0/16",
        i32::from(APP_PORT) + i32::from(generation % 4),
    );
    json!({
        "metadata": {"namespace": namespace_name(p % namespaces), "name": format!("policy-{p}")},
        "spec": spec
    })
}

/// Every object of `size`, kinds in the order an API server gets them
/// from a cluster coming up (namespaces and nodes before pods, Services
/// before their slices), `trigger` on every slice.
pub fn all(size: &Size, trigger: &str) -> impl Iterator<Item = (Kind, Value)> {
    let size = *size;
    let trigger = trigger.to_string();
    (0..size.namespaces())
        .map(|ns| (Kind::Namespace, namespace(ns)))
        .chain((0..size.nodes).map(|n| (Kind::Node, node(n))))
        .chain((0..size.pods).map(move |i| (Kind::Pod, pod(&size, i))))
        .chain((0..size.services).map(|s| (Kind::Service, service(s))))
        .chain((0..size.services).map(move |s| {
            (
                Kind::EndpointSlice,
                endpoint_slice(&size, s, |_| true, &trigger),
            )
        }))
        .chain((0..size.policies).map(move |p| (Kind::NetworkPolicy, policy(&size, p, 0))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_pod_address_is_unique_and_in_its_nodes_cidr() {
        for size in &SIZES[..3] {
            let mut seen = BTreeSet::new();
            for i in 0..size.pods {
                let address = pod_address(size, i);
                assert!(seen.insert(address), "{address} twice in {}", size.name);
                let cidr: ipnetwork::IpNetwork = pod_cidr(i % size.nodes).parse().unwrap();
                assert!(cidr.contains(address), "{address} outside {cidr}");
            }
        }
        assert_eq!(SIZES[4].pods / SIZES[4].nodes, PODS_PER_NODE);
    }

    #[test]
    fn each_service_fronts_its_apps_replicas() {
        let size = SIZES[0];
        let slice = endpoint_slice(&size, 13, |i| i % 2 == 0, "2026-11-29T21:00:00Z");
        let pods: Vec<Value> = service_pods(13).map(|i| pod(&size, i)).collect();
        let namespace = &service(13)["metadata"]["namespace"];
        for pod in &pods {
            assert_eq!(&pod["metadata"]["namespace"], namespace);
            assert_eq!(
                pod["metadata"]["labels"]["app"],
                service(13)["spec"]["selector"]["app"]
            );
        }
        assert_eq!(slice["endpoints"].as_array().unwrap().len(), REPLICAS / 2);
        assert_eq!(size.endpoints(), size.services * REPLICAS);
        assert!(size.services * REPLICAS <= size.pods);
    }

    #[test]
    fn sizes_grow_to_the_issues_largest() {
        let xl = SIZES[4];
        assert_eq!(
            (xl.nodes, xl.pods, xl.services, xl.policies),
            (5_000, 150_000, 10_000, 30_000)
        );
        assert_eq!(xl.endpoints(), 100_000);
        let counts = |size: &Size| all(size, "t").count();
        let xs = SIZES[0];
        assert_eq!(
            counts(&xs),
            xs.namespaces() + xs.nodes + xs.pods + 2 * xs.services + xs.policies
        );
        // Every policy namespace exists.
        assert!(
            policy(&xs, xs.policies - 1, 0)["metadata"]["namespace"]
                .as_str()
                .unwrap()
                .ends_with(&format!("-{}", (xs.policies - 1) % xs.namespaces()))
        );
    }
}

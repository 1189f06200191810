//! Egress to a ClusterIP, judged by the Service's backends: the frontends
//! read from Services and EndpointSlices, and what they add to a plan.

use crate::services::EndpointSlice;
use crate::services::Service;
use serde_json::{Value, json};

use super::*;
use crate::services::frontends;

pub(super) fn service(namespace: &str, name: &str, cluster_ips: &[&str], ports: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"clusterIP": cluster_ips.first(), "clusterIPs": cluster_ips, "ports": ports}
    }))
    .unwrap()
}

/// A slice of `service` with `endpoints` ((address, ready)) on `ports`.
pub(super) fn slice(
    namespace: &str,
    service: &str,
    n: u32,
    ports: Value,
    endpoints: &[(&str, Option<bool>)],
) -> EndpointSlice {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(address, ready)| match ready {
            Some(ready) => json!({"addresses": [address], "conditions": {"ready": ready}}),
            None => json!({"addresses": [address]}),
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": namespace, "name": format!("{service}-{n}"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints
    }))
    .unwrap()
}

fn dns_objects() -> (Vec<Service>, Vec<EndpointSlice>) {
    let services = vec![
        service(
            "kube-system",
            "kube-dns",
            &["10.96.0.10", "fd96::a"],
            json!([{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
                   {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353}]),
        ),
        // Headless: no ClusterIP, nothing to translate.
        service("kube-system", "headless", &["None"], json!([{"port": 80}])),
        // Two backends, one of them outside the pods' egress.
        service(
            "y",
            "mixed",
            &["10.96.0.20"],
            json!([{"port": 80, "targetPort": 80}]),
        ),
        // No ready endpoint.
        service("y", "empty", &["10.96.0.30"], json!([{"port": 80}])),
    ];
    let slices = vec![
        slice(
            "kube-system",
            "kube-dns",
            1,
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"},
                   {"name": "dns-tcp", "port": 5353, "protocol": "TCP"}]),
            &[
                ("10.0.9.1", Some(true)),
                ("10.0.9.2", None),
                ("10.0.9.3", Some(false)),
            ],
        ),
        slice(
            "kube-system",
            "kube-dns",
            2,
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
            &[("fd00::9:1", Some(true))],
        ),
        slice(
            "y",
            "mixed",
            1,
            json!([{"port": 80, "protocol": "TCP"}]),
            &[("10.0.2.3", None), ("10.0.2.4", None)],
        ),
        slice(
            "y",
            "empty",
            1,
            json!([{"port": 80, "protocol": "TCP"}]),
            &[("10.0.2.5", Some(false))],
        ),
    ];
    (services, slices)
}

/// x/a may send to kube-system's DNS pods on 5353 and to y/c (10.0.2.3)
/// on 80, nothing else.
fn egress_plan() -> Plan {
    egress_plan_with(
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [
            {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                     "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
             "ports": [{"protocol": "UDP", "port": 5353}, {"protocol": "TCP", "port": 5353}]},
            {"to": [{"podSelector": {"matchLabels": {"pod": "c"}},
                     "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}],
             "ports": [{"protocol": "TCP", "port": 80}]}
        ]}),
    )
}

/// The pods, namespaces and Services of `dns_objects` with one egress
/// policy `spec` in x.
fn egress_plan_with(spec: Value) -> Plan {
    let (services, slices) = dns_objects();
    let services: Vec<&Service> = services.iter().collect();
    let slices: Vec<&EndpointSlice> = slices.iter().collect();
    let namespaces = [
        namespace("x", json!({})),
        namespace("y", json!({})),
        namespace("kube-system", json!({})),
    ];
    let pods = [
        pod("x", "a", &["10.0.1.1"]).build(),
        pod("y", "c", &["10.0.2.3"]).on("node-2").build(),
        pod("y", "d", &["10.0.2.4"]).on("node-2").build(),
        pod("kube-system", "dns-1", &["10.0.9.1"])
            .labels(json!({"k8s-app": "kube-dns"}))
            .on("node-2")
            .build(),
        pod("kube-system", "dns-2", &["10.0.9.2"])
            .labels(json!({"k8s-app": "kube-dns"}))
            .on("node-2")
            .build(),
    ];
    let policies = [policy("x", "egress", spec)];
    let policies: Vec<&NetworkPolicy> = policies.iter().collect();
    let pods: Vec<&Pod> = pods.iter().collect();
    let namespaces: Vec<&Namespace> = namespaces.iter().collect();
    let here = crate::services::Here {
        node: NODE,
        zone: None,
    };
    let frontends = frontends(&services, &slices, here);
    plan_of(
        NODE,
        (&policies, &pods, &namespaces),
        &frontends,
        &super::super::LocalIps::default(),
        &mut identity::IdentityNumbers::default(),
    )
}

#[test]
fn a_cluster_ip_is_allowed_where_every_backend_is() {
    let plan = egress_plan();
    let egress = &of(&plan, "x/a").egress;
    // DNS through its ClusterIP, both protocols; the not-ready backend
    // (10.0.9.3) is not one kube-proxy sends to.
    assert!(egress.allows(ip("10.96.0.10"), UDP, 53));
    assert!(egress.allows(ip("10.96.0.10"), TCP, 53));
    // Only the Service's port, not the target port or others.
    assert!(!egress.allows(ip("10.96.0.10"), UDP, 5353));
    assert!(!egress.allows(ip("10.96.0.10"), UDP, 54));
    // The IPv6 ClusterIP's backend (fd00::9:1) is no pod the policy
    // selects: denied, though the IPv4 one is allowed.
    assert!(!egress.allows(ip("fd96::a"), UDP, 53));
    // One backend allowed (y/c), one not (y/d): not through the ClusterIP.
    assert!(!egress.allows(ip("10.96.0.20"), TCP, 80));
    assert!(egress.allows(ip("10.0.2.3"), TCP, 80));
    // No ready backend: nothing to allow.
    assert!(!egress.allows(ip("10.96.0.30"), TCP, 80));
}

#[test]
fn without_services_a_cluster_ip_is_an_address_like_any_other() {
    let plan = plan(
        NODE,
        &[policy(
            "x",
            "dns",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]}),
        )],
        &[pod("x", "a", &["10.0.1.1"]).build()],
        &[namespace("x", json!({}))],
    );
    // A port-only rule allows every address, ClusterIPs included.
    assert!(of(&plan, "x/a").egress.allows(ip("10.96.0.10"), UDP, 53));
    assert!(!of(&plan, "x/a").egress.allows(ip("10.96.0.10"), TCP, 53));
}

/// The netpol suite's "except clause" specs probe through Services: an
/// ipBlock of `0.0.0.0/4` except one pod contains the ClusterIPs too, and
/// must not let the pod reach the excepted backend through its Service.
#[test]
fn an_ip_block_does_not_allow_a_cluster_ip_whose_backend_it_excepts() {
    let except_d = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/4", "except": ["10.0.2.4/32"]}}]}]});
    let plan = egress_plan_with(except_d);
    let egress = &of(&plan, "x/a").egress;
    // y/mixed has y/d (excepted) behind it: withheld, whatever the port.
    assert!(!egress.allows(ip("10.96.0.20"), TCP, 80));
    assert!(!egress.allows(ip("10.96.0.20"), TCP, 81));
    // y/c directly, still; and DNS, whose backends the block allows.
    assert!(egress.allows(ip("10.0.2.3"), TCP, 80));
    assert!(!egress.allows(ip("10.0.2.4"), TCP, 80));
    assert!(egress.allows(ip("10.96.0.10"), UDP, 53));
    // No ready backend: withheld too (kube-proxy rejects it anyway).
    assert!(!egress.allows(ip("10.96.0.30"), TCP, 80));
    // The same block with a second rule allowing y/d again: the Service
    // is reachable (the "IP overlapping both CIDR and except" spec).
    let both = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/4", "except": ["10.0.2.4/32"]}}]},
                   {"to": [{"ipBlock": {"cidr": "10.0.2.4/32"}}]}]});
    let plan = egress_plan_with(both);
    let egress = &of(&plan, "x/a").egress;
    assert!(egress.allows(ip("10.96.0.20"), TCP, 80));
    assert!(egress.allows(ip("10.0.2.4"), TCP, 80));
}

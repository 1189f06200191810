//! The NodePort tests' cluster and API objects: cp-1 and worker-1 with
//! `--services ebpf` agents and an outside client on their segment
//! (IPv4, and IPv6 on dual-stack nodes), the NodePort Services and
//! EndpointSlices they serve, and the check that the uplink program
//! translated both ways.

use std::net::Ipv4Addr;

use flatnet_common::action;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;

use crate::socket_lb::api::{BACKEND_PORT, api_service, api_slice, ebpf_services_cluster_flagged};

pub(super) const NODE_PORT: u16 = 30080;

/// A NodePort whose backends' port nothing listens on.
pub(super) const CLOSED_NODE_PORT: u16 = NODE_PORT + 3;

pub(super) const CLOSED_BACKEND_PORT: u16 = BACKEND_PORT + 1;

/// A UDP NodePort whose backends answer late (`LateUdp`).
pub(super) const LATE_NODE_PORT: u16 = NODE_PORT + 4;

pub(super) const LATE_BACKEND_PORT: u16 = BACKEND_PORT + 2;

pub(crate) const OUTSIDE: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 100);

/// The outside client's IPv6 address on the nodes' segment.
pub(super) const OUTSIDE6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 0x64);

/// cp-1 and worker-1 with `--services ebpf` agents following `stub`, and
/// the outside client's address (`OUTSIDE`) on the underlay's switch.
pub(crate) fn two_nodes_and_outside(
    cgroup: &TestCgroup,
    stub: &ApiStub,
) -> (Cluster, Vec<flatnet_tests::kube_stub::ServedStub>) {
    two_nodes_and_outside_flagged(cgroup, stub, &[])
}

/// `two_nodes_and_outside` with more agent flags (`--routing vxlan`).
pub(crate) fn two_nodes_and_outside_flagged(
    cgroup: &TestCgroup,
    stub: &ApiStub,
    flags: &[&str],
) -> (Cluster, Vec<flatnet_tests::kube_stub::ServedStub>) {
    let nodes = ebpf_services_cluster_flagged(
        &specs(&[
            ("cp-1", 1, Some("10.244.0.0/24")),
            ("worker-1", 2, Some("10.244.1.0/24")),
        ]),
        cgroup,
        stub,
        flags,
    );
    nodes
        .0
        ._switch
        .exec(&["ip", "addr", "add", &format!("{OUTSIDE}/24"), "dev", "br0"]);
    nodes
}

/// cp-1 and worker-1, dual-stack, and `stub`'s Node objects saying so
/// (an IPv6 InternalIP, both pod CIDRs).
pub(super) fn dual_stack_nodes(stub: &ApiStub) -> Vec<NodeSpec> {
    let mut specs = flatnet_tests::cluster::specs(&[
        ("cp-1", 1, Some("10.244.0.0/24")),
        ("worker-1", 2, Some("10.244.1.0/24")),
    ]);
    for spec in &mut specs {
        spec.dual_stack = true;
        let (address6, cidr6) = (spec.address6().to_string(), spec.pod_cidr6());
        let cidr4 = spec.pod_cidr.clone().unwrap();
        stub.modify(Kind::Node, &spec.name, |node| {
            node["status"]["addresses"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"type": "InternalIP", "address": address6}));
            node["spec"]["podCIDR"] = cidr4.clone().into();
            node["spec"]["podCIDRs"] = serde_json::json!([cidr4, cidr6]);
        });
    }
    specs
}

/// The outside client's IPv6 address on the switch.
pub(super) fn add_outside6(outside: &Netns) {
    outside.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{OUTSIDE6}/64"),
        "dev",
        "br0",
        "nodad",
    ]);
}

/// A NodePort Service `name` (ClusterIP `ip`) of type NodePort on
/// `node_port`: its TCP port "http" only.
pub(super) fn tcp_node_port_service(name: &str, ip: Ipv4Addr, node_port: u16) -> serde_json::Value {
    let mut service = api_service(name, ip);
    service["spec"]["type"] = "NodePort".into();
    service["spec"]["ports"][0]["nodePort"] = node_port.into();
    service
}

/// `tcp_node_port_service` with a UDP port "dns" on the same NodePort.
pub(super) fn node_port_service(name: &str, ip: Ipv4Addr, node_port: u16) -> serde_json::Value {
    let mut service = tcp_node_port_service(name, ip, node_port);
    crate::socket_lb::api::add_udp_twin(&mut service);
    service
}

/// The EndpointSlice of a `node_port_service`: `endpoints` (address,
/// node) ready, "http" and "dns" on `BACKEND_PORT`.
pub(super) fn node_port_slice(name: &str, endpoints: &[(Ipv4Addr, &str)]) -> serde_json::Value {
    let mut slice = api_slice(name, endpoints);
    slice["ports"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "dns", "port": BACKEND_PORT, "protocol": "UDP"}));
    slice
}

/// A dual-stack `node_port_service` `name`, its ClusterIPs 10.96.9.`n` and
/// fd96::9:`n` (the same digits).
pub(super) fn dual_stack_node_port_service(name: &str, n: u8, node_port: u16) -> serde_json::Value {
    let mut service = node_port_service(name, Ipv4Addr::new(10, 96, 9, n), node_port);
    service["spec"]["clusterIPs"] =
        serde_json::json!([format!("10.96.9.{n}"), format!("fd96::9:{n}")]);
    service["spec"]["ipFamilies"] = serde_json::json!(["IPv4", "IPv6"]);
    service["spec"]["ipFamilyPolicy"] = "RequireDualStack".into();
    service
}

/// The IPv6 EndpointSlice of a dual-stack `node_port_service`: `endpoints`
/// (address, node) ready, "http" and "dns" on `backend_port`.
pub(super) fn ipv6_node_port_slice(
    name: &str,
    endpoints: &[(std::net::Ipv6Addr, &str)],
    backend_port: u16,
) -> serde_json::Value {
    let mut slice = node_port_slice(name, &[]);
    slice["metadata"]["name"] = format!("{name}-v6").into();
    slice["addressType"] = "IPv6".into();
    for port in slice["ports"].as_array_mut().expect("ports") {
        port["port"] = backend_port.into();
    }
    slice["endpoints"] = endpoints
        .iter()
        .map(|(address, node)| {
            serde_json::json!({"addresses": [address.to_string()], "nodeName": node,
                               "conditions": {"ready": true}})
        })
        .collect();
    slice
}

/// `node`'s uplink program translated outside clients' flows both ways:
/// to a local backend, to the other node's, and replies back (`context`
/// names the case in the message).
pub(super) fn assert_served_in_bpf(node: &SimNode, context: &str) {
    for what in [
        action::NODEPORT_TO_POD,
        action::NODEPORT_TO_NODE,
        action::NODEPORT_REPLIED,
    ] {
        assert!(
            node.packets(what) > 0,
            "{context}: {} counted no {}",
            node.spec.name,
            action::NAMES[what as usize]
        );
    }
}

//! The Services the API stub serves to the socket tests (and to the
//! NodePort and hostPort tests): a ClusterIP Service, its UDP twin port,
//! its EndpointSlice, and a simulated cluster whose agents follow the stub
//! with `--services ebpf`.

use std::net::Ipv4Addr;

use flatnet_tests::cgroup::TestCgroup;
use serde_json::Value;

pub(crate) const BACKEND_PORT: u16 = 8080;

/// A Service as the stub serves it, ClusterIP `ip`, one port "http" (80,
/// TCP) to the named target port "http".
pub(crate) fn api_service(name: &str, ip: Ipv4Addr) -> Value {
    serde_json::json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]}
    })
}

/// A UDP port "dns" beside `service`'s first port, on the same port and
/// NodePort, its target the endpoints' "dns".
pub(crate) fn add_udp_twin(service: &mut Value) {
    let mut udp_port = service["spec"]["ports"][0].clone();
    udp_port["name"] = "dns".into();
    udp_port["protocol"] = "UDP".into();
    udp_port["targetPort"] = "dns".into();
    service["spec"]["ports"]
        .as_array_mut()
        .expect("ports")
        .push(udp_port);
}

/// Its EndpointSlice: "http" is `BACKEND_PORT` on the pods; each endpoint
/// (address, node) ready.
pub(crate) fn api_slice(service: &str, endpoints: &[(Ipv4Addr, &str)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node)| {
            serde_json::json!({"addresses": [ip.to_string()], "nodeName": node,
                               "conditions": {"ready": true}})
        })
        .collect();
    serde_json::json!({
        "metadata": {"namespace": "default", "name": format!("{service}-1"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

/// A simulated cluster of `nodes` whose agents run `--services ebpf` with
/// the socket programs on `cgroup`, following `stub`; ready.
pub(crate) fn ebpf_services_cluster(
    nodes: &[(&str, u8, Option<&str>)],
    cgroup: &TestCgroup,
    stub: &flatnet_tests::kube_stub::ApiStub,
) -> (
    flatnet_tests::cluster::Cluster,
    Vec<flatnet_tests::kube_stub::ServedStub>,
) {
    ebpf_services_cluster_of(&flatnet_tests::cluster::specs(nodes), cgroup, stub)
}

/// `ebpf_services_cluster` of nodes as `specs` describe them.
pub(crate) fn ebpf_services_cluster_of(
    specs: &[flatnet_tests::cluster::NodeSpec],
    cgroup: &TestCgroup,
    stub: &flatnet_tests::kube_stub::ApiStub,
) -> (
    flatnet_tests::cluster::Cluster,
    Vec<flatnet_tests::kube_stub::ServedStub>,
) {
    ebpf_services_cluster_flagged(specs, cgroup, stub, &[])
}

/// `ebpf_services_cluster_of` with more agent flags.
pub(crate) fn ebpf_services_cluster_flagged(
    specs: &[flatnet_tests::cluster::NodeSpec],
    cgroup: &TestCgroup,
    stub: &flatnet_tests::kube_stub::ApiStub,
    flags: &[&str],
) -> (
    flatnet_tests::cluster::Cluster,
    Vec<flatnet_tests::kube_stub::ServedStub>,
) {
    let mut cluster = flatnet_tests::cluster::Cluster::new(specs);
    for node in &mut cluster.nodes {
        node.agent_flags = vec![
            "--services".into(),
            "ebpf".into(),
            "--services-cgroup".into(),
            cgroup.0.display().to_string(),
        ];
        node.agent_flags
            .extend(flags.iter().map(|flag| flag.to_string()));
    }
    let served = cluster.start_agents_on_api(stub);
    (cluster, served)
}

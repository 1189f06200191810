//! `externalTrafficPolicy: Local` NodePorts reached by pods of other
//! nodes, with kube-proxy absent (`--services ebpf`): the node with the
//! backend translates the flow and keeps the pod's address, so the
//! backend's reply is addressed to a pod of another node, and must still
//! be translated back before it is routed there (upstream's "should
//! fallback to local terminating endpoints ... externalTrafficPolicy=Local"
//! asks exactly this of a pod on another node). And the same seen through
//! kube-proxy's iptables rules on flatnet's fast path, the reference.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use flatnet_common::action;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_proxy::{Mode, Protocol, ServicePort};
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;

use crate::nodeport::exchanges::{Echo, tcp_ask, udp_ask};
use crate::nodeport::fixture::two_nodes_and_outside_flagged;
use crate::socket_lb::api::{BACKEND_PORT, add_udp_twin, api_service, api_slice};

const NODE_PORT: u16 = 30180;
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 9, 40);

/// What a pod on worker-1 and one on cp-1 get from the Local NodePort
/// whose one backend is on cp-1, its answers with the client's address
/// named by role (the two clusters' pods have addresses of their own).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// worker-1's pod to cp-1's NodePort: the TCP answers.
    tcp: BTreeSet<String>,
    /// The same over UDP: the answer, and whether it came from the NodePort.
    udp: (String, bool),
    /// cp-1's pod to worker-1's NodePort, where no backend is: answered.
    served_without_a_local_backend: bool,
}

/// The pods: the backend (cp-1, serving), the client (worker-1), the
/// neighbour (cp-1).
struct Pods<'a> {
    backend: SimPod<'a>,
    client: SimPod<'a>,
    neighbour: SimPod<'a>,
}

impl<'a> Pods<'a> {
    fn on(cluster: &'a Cluster) -> Self {
        let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
        Pods {
            backend: cp.pod(),
            client: worker.pod(),
            neighbour: cp.pod(),
        }
    }

    /// What the clients get, once the client's first TCP answer came
    /// (the NodePort served).
    fn seen(&self, cluster: &Cluster) -> Seen {
        let cp_port = SocketAddr::from((cluster.node("cp-1").spec.address(), NODE_PORT));
        let worker_port = SocketAddr::from((cluster.node("worker-1").spec.address(), NODE_PORT));
        let by_role = |answer: String| answer.replace(&self.client.ip.to_string(), "client");
        wait_until("cp-1 to serve the Local NodePort", SETTLE, || {
            tcp_ask(&self.client.netns, cp_port).is_ok()
        });
        let tcp = (0..8)
            .map(|_| by_role(tcp_ask(&self.client.netns, cp_port).expect("TCP from worker-1")))
            .collect();
        let (answer, from) = udp_ask(&self.client.netns, cp_port).expect("UDP from worker-1");
        Seen {
            tcp,
            udp: (by_role(answer), from == cp_port),
            served_without_a_local_backend: tcp_ask(&self.neighbour.netns, worker_port).is_ok(),
        }
    }
}

/// A pod on worker-1 reaches cp-1's Local NodePort, whose one backend is on
/// cp-1: served by cp-1's backend, which sees the pod's own address, the
/// answers (TCP and UDP) coming back from the NodePort; the reply was
/// translated in BPF (counted), not left to leave untranslated as a
/// packet between pods. A pod on cp-1 asking worker-1's NodePort, where no
/// backend is, gets nothing, as upstream's spec requires. With the nodes'
/// pods routed directly and through the VXLAN tunnel.
#[flatnet_test(root, cases(direct(&[]), vxlan(&["--routing", "vxlan"])))]
fn pods_of_other_nodes_reach_a_local_node_port(routing: &[&str]) {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) = two_nodes_and_outside_flagged(&cgroup, &stub, routing);
    let pods = Pods::on(&cluster);
    let _server = Echo::start(&pods.backend.netns, "backend");
    let mut service = api_service("local", CLUSTER_IP);
    service["spec"]["type"] = "NodePort".into();
    service["spec"]["externalTrafficPolicy"] = "Local".into();
    service["spec"]["ports"][0]["nodePort"] = NODE_PORT.into();
    add_udp_twin(&mut service);
    stub.add(Kind::Service, service);
    let mut slice = api_slice("local", &[(pods.backend.ip, "cp-1")]);
    slice["ports"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "dns", "port": BACKEND_PORT, "protocol": "UDP"}));
    stub.add(Kind::EndpointSlice, slice);

    let cp = cluster.node("cp-1");
    let replied = cp.packets(action::NODEPORT_REPLIED);
    let seen = pods.seen(&cluster);
    assert_eq!(seen, expected(), "{routing:?}");
    assert!(
        cp.packets(action::NODEPORT_REPLIED) > replied,
        "cp-1 translated no reply to worker-1's pod in BPF"
    );
}

/// What both clusters give: the backend sees the client pod's address,
/// the answers come from the NodePort, and no other node serves it.
fn expected() -> Seen {
    Seen {
        tcp: BTreeSet::from(["backend client".to_string()]),
        udp: ("backend client".to_string(), true),
        served_without_a_local_backend: false,
    }
}

/// The reference: the same Service as kube-proxy's iptables rules hold it
/// on each node (cp-1's with its local endpoint, worker-1's with none, as
/// kube-proxy drops it there), the pods on flatnet's fast path with
/// kube-proxy present. A pod's traffic to a NodePort goes to every
/// endpoint there (kube-proxy's "pod traffic for ... external
/// destinations"), which is cp-1's one backend: the outcome is flatnet's.
/// (From cp-1's pod to worker-1's NodePort kube-proxy sends the flow to
/// cp-1's backend, whose reply comes back from its own address, not the
/// NodePort, and the client resets it: not served either, as with
/// flatnet, which drops it.)
#[flatnet_test(root)]
fn a_local_node_port_from_another_nodes_pod_as_through_kube_proxys_rules() {
    let cluster = Cluster::started(
        &specs(&[
            ("cp-1", 1, Some("10.244.0.0/24")),
            ("worker-1", 2, Some("10.244.1.0/24")),
        ]),
        &[],
    );
    let pods = Pods::on(&cluster);
    let _server = Echo::start(&pods.backend.netns, "backend");
    let backend = |port: u16| SocketAddr::from((pods.backend.ip, port));
    let cluster_ip = IpAddr::V4(CLUSTER_IP);
    cluster.program_kube_proxy_per_node(Mode::Iptables, |node| {
        let local = if node.spec.name == "cp-1" {
            vec![backend(BACKEND_PORT)]
        } else {
            Vec::new()
        };
        [(80, Protocol::Tcp), (53, Protocol::Udp)]
            .map(|(port, protocol)| {
                ServicePort::cluster_ip(
                    "local",
                    cluster_ip,
                    port,
                    protocol,
                    vec![backend(BACKEND_PORT)],
                )
                .with_node_port(NODE_PORT)
                .with_local_external_traffic(local.clone())
            })
            .to_vec()
    });
    assert_eq!(pods.seen(&cluster), expected());
}

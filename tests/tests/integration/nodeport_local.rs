//! `externalTrafficPolicy: Local` NodePorts reached by pods of other
//! nodes, with kube-proxy absent (`--services ebpf`): the node with the
//! backend translates the flow and keeps the pod's address, so the
//! backend's reply is addressed to a pod of another node, and must still
//! be translated back before it is routed there (upstream's "should
//! fallback to local terminating endpoints ... externalTrafficPolicy=Local"
//! asks exactly this of a pod on another node).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};

use flatnet_common::action;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;

use crate::nodeport::{Echo, tcp_ask, two_nodes_and_outside_flagged, udp_ask};
use crate::socket_lb::{BACKEND_PORT, add_udp_twin, api_service, api_slice};

const NODE_PORT: u16 = 30180;

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
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let (backend, client, neighbour) = (cp.pod(), worker.pod(), cp.pod());
    let _server = Echo::start(&backend.netns, "backend");
    let mut service = api_service("local", Ipv4Addr::new(10, 96, 9, 40));
    service["spec"]["type"] = "NodePort".into();
    service["spec"]["externalTrafficPolicy"] = "Local".into();
    service["spec"]["ports"][0]["nodePort"] = NODE_PORT.into();
    add_udp_twin(&mut service);
    stub.add(Kind::Service, service);
    let mut slice = api_slice("local", &[(backend.ip, "cp-1")]);
    slice["ports"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "dns", "port": BACKEND_PORT, "protocol": "UDP"}));
    stub.add(Kind::EndpointSlice, slice);

    let cp_port = SocketAddr::from((cp.spec.address(), NODE_PORT));
    let worker_port = SocketAddr::from((worker.spec.address(), NODE_PORT));
    let answer = format!("backend {}", client.ip);
    wait_until("cp-1 to serve the Local NodePort", SETTLE, || {
        tcp_ask(&client.netns, cp_port).is_ok_and(|got| got == answer)
    });
    let replied = cp.packets(action::NODEPORT_REPLIED);
    let answers: BTreeSet<String> = (0..8)
        .map(|_| tcp_ask(&client.netns, cp_port).expect("TCP from worker-1's pod"))
        .collect();
    assert_eq!(
        answers,
        BTreeSet::from([answer.clone()]),
        "TCP to {cp_port}"
    );
    let (got, from) = udp_ask(&client.netns, cp_port).expect("UDP from worker-1's pod");
    assert_eq!((got, from), (answer, cp_port), "UDP to {cp_port}");
    assert!(
        cp.packets(action::NODEPORT_REPLIED) > replied,
        "cp-1 translated no reply to worker-1's pod in BPF"
    );

    assert!(
        tcp_ask(&neighbour.netns, worker_port).is_err(),
        "{worker_port} has no local backend, but a pod of cp-1 was served through it"
    );
}

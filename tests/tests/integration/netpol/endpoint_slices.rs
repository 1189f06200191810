//! An API server without discovery.k8s.io/v1 EndpointSlices (Kubernetes
//! before 1.21, or one that does not serve them): NetworkPolicy reported
//! down, saying which API is missing, and new pods isolated, never open.

use super::*;

/// The agent needs discovery.k8s.io/v1 EndpointSlices (Services'
/// backends judge egress to a ClusterIP). An API server without them
/// leaves NetworkPolicy down, and the agent says so, naming the API it
/// lacks (`/readyz`, the feature gauge, CNI STATUS), while new pods start
/// isolated both ways: never silently open.
#[flatnet_test(root)]
fn an_api_server_without_endpoint_slices_v1_leaves_policy_down() {
    let policy_down = "flatnet_agent_feature_ready{feature=\"network_policy\"} 0";
    let cluster = cluster();
    let stub = ApiStub::from_fixture();
    stub.without_endpoint_slices();
    let n1 = &cluster.nodes[0];
    let served = ServedStub::serve_in(stub.clone(), &n1.netns);
    n1.start_agent(&Peers::Api(served.url.clone()));
    let marker = n1.ready_marker();
    wait_until("the agent to say which API it lacks", SETTLE, || {
        std::fs::read_to_string(&marker)
            .is_ok_and(|m| m.contains("\"down\"") && m.contains("does not serve"))
    });
    let said = std::fs::read_to_string(&marker).unwrap();
    assert!(
        said.contains("NetworkPolicy is not enforced on this node: EndpointSlice (discovery.k8s.io/v1) cannot be listed: the API server does not serve discovery.k8s.io/v1"),
        "{said}"
    );
    let page = n1.agent_http("/readyz");
    assert!(page.starts_with("HTTP/1.0 503"), "{page}");
    assert!(page.contains("NetworkPolicy is not enforced"), "{page}");
    let metrics = n1.metrics();
    assert!(metrics.contains(policy_down), "{metrics}");
    assert!(metrics.contains("flatnet_agent_ready 0"), "{metrics}");
    let mut conf = Conflist::new(n1.conflist()).first_plugin_conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["agentManaged"] = json!(true);
    let status = CniCall {
        command: "STATUS".into(),
        path: n1.bin_dir().display().to_string(),
        node: Some(n1.netns.path()),
        ..CniCall::default()
    }
    .run(&n1.bin_dir().join("flatnet"), conf.to_string().as_bytes());
    status.assert_error(50, "NetworkPolicy is not enforced on this node");
    // Never silently open: a new pod of a namespace without policies (none
    // could be listed) starts isolated both ways.
    let pod = n1.pod_in(Netns::new(), &kubelet_args("y", "b"));
    assert_eq!(
        policy_flags(n1, pod.ip),
        flatnet_common::POLICY_F_INGRESS | flatnet_common::POLICY_F_EGRESS
    );
}

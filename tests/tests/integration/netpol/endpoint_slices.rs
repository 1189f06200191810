//! EndpointSlices as Kubernetes 1.17-1.20 serve them (v1beta1 only), or
//! none at all: enforced on the first, reported down (new pods isolated,
//! never open) on the second.

use super::*;

/// Kubernetes 1.17-1.20 serve EndpointSlices as discovery.k8s.io/v1beta1
/// only: the agent reads them there and enforces policy. An API server
/// without them at all leaves NetworkPolicy down, and the agent says so
/// (`/readyz`, the feature gauge, CNI STATUS), while new pods start
/// isolated both ways: never silently open.
#[flatnet_test(root)]
fn endpoint_slices_of_kubernetes_1_20_or_none_at_all() {
    let (policy_ready, policy_down) = (
        "flatnet_agent_feature_ready{feature=\"network_policy\"} 1",
        "flatnet_agent_feature_ready{feature=\"network_policy\"} 0",
    );
    // Kubernetes 1.20: v1beta1 only.
    {
        let cluster = cluster();
        let stub = ApiStub::from_fixture();
        stub.serve_slices_as("v1beta1");
        for namespace in NAMESPACES {
            stub.add(Kind::Namespace, model_namespace(namespace));
        }
        let _served = cluster.start_agents_on_api(&stub);
        let n1 = &cluster.nodes[0];
        wait_until("NetworkPolicy up on v1beta1 EndpointSlices", SETTLE, || {
            n1.metrics().contains(policy_ready)
        });
        assert!(n1.agent_log().contains("discovery.k8s.io/v1beta1"));
        assert!(
            n1.agent_http("/readyz").starts_with("HTTP/1.0 200"),
            "{}",
            n1.agent_http("/readyz")
        );
        stub.add(Kind::NetworkPolicy, deny_all_egress("x"));
        stub.add(Kind::Pod, pending_pod("x", "a", &n1.spec.name));
        let pod = n1.pod_in(Netns::new(), &kubelet_args("x", "a"));
        wait_until("x/a's egress isolation written", SETTLE, || {
            policy_flags(n1, pod.ip) == flatnet_common::POLICY_F_EGRESS
        });
        let errors = metric(&n1.metrics(), "flatnet_policy_errors_total").unwrap_or(0.0);
        assert_eq!(errors, 0.0, "{}", n1.agent_log());
    }
    // No EndpointSlice API at all.
    let cluster = cluster();
    let stub = ApiStub::from_fixture();
    stub.serve_slices_as("");
    let n1 = &cluster.nodes[0];
    let listener = n1
        .netns
        .run(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .expect("a loopback listener in the node");
    let served = ServedStub::serve(stub.clone(), listener);
    n1.start_agent(&Peers::Api(served.url.clone()));
    let marker = n1.ready_marker();
    wait_until("the agent to say NetworkPolicy is down", SETTLE, || {
        std::fs::read_to_string(&marker).is_ok_and(|m| m.contains("\"down\""))
    });
    let said = std::fs::read_to_string(&marker).unwrap();
    assert!(
        said.contains("NetworkPolicy is not enforced on this node: EndpointSlice (discovery.k8s.io/v1) cannot be listed"),
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

//! How long a NetworkPolicy change takes to reach a pod's maps, as an
//! operator sees it: one simulated node whose agent watches the API stub
//! holding a cluster of realistic size (1,000 pods in 20 namespaces, 500
//! policies; the same shapes as the agent's `policy::tests::scale`), a few
//! of the pods real ones made through the plugin on this node. Reported,
//! not asserted: only that every change landed.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{Kind, ServedStub, api_namespace, api_pod, metric};
use flatnet_tests::*;
use serde_json::{Value, json};

const NODE: &str = "cp-1";
const NAMESPACES: usize = 20;
const PODS: usize = 1_000;
const POLICIES: usize = 500;
/// Nodes other than this one whose pods are synthetic: 10.244.1-9.0/24.
const OTHER_NODES: usize = 9;
const APPS: usize = 10;
/// Pods 0..REAL are real ones on this node.
const REAL: usize = 4;
/// The policy changed: in ns-0, selecting app-0 (real pod 0), allowing
/// ingress from the namespace's web tier on `port` and on `http`.
const CHANGED: usize = 40;
const PORTS: [i32; 2] = [80, 8443];
const RUNS: usize = 10;

/// Pod `i` of the cluster, Running on `node` at `ip`.
fn cluster_pod(i: usize, node: &str, ip: IpAddr) -> Value {
    let name = format!("pod-{i}");
    let tier = ["web", "api", "db"][i % 3];
    let labels = json!({"app": format!("app-{}", i % APPS), "tier": tier, "pod": name});
    let containers = json!([{"name": "c", "image": "busybox", "ports": [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}
    ]}]);
    api_pod(
        &format!("ns-{}", i % NAMESPACES),
        &name,
        node,
        ip,
        labels,
        containers,
    )
}

/// A synthetic pod `i` (>= REAL) of another node, in that node's CIDR.
fn synthetic_pod(i: usize) -> Value {
    let n = 1 + i % OTHER_NODES;
    let ip = IpAddr::V4(Ipv4Addr::new(10, 244, n as u8, (2 + i / OTHER_NODES) as u8));
    cluster_pod(i, &format!("worker-{n}"), ip)
}

fn namespace(i: usize) -> Value {
    let env = if i.is_multiple_of(2) { "prod" } else { "dev" };
    api_namespace(
        &format!("ns-{i}"),
        json!({"env": env, "team": format!("team-{}", i % 5)}),
    )
}

/// Policy `i` (`flatnet_agent::policy::scale_fixture`, as the agent's
/// scale test builds it).
fn api_policy(i: usize, port: i32) -> Value {
    let except = format!("10.244.{}.0/24", 1 + i % OTHER_NODES);
    let spec =
        flatnet_agent::policy::scale_fixture::policy_spec(i, NAMESPACES, APPS, &except, port);
    json!({"metadata": {"namespace": format!("ns-{}", i % NAMESPACES), "name": format!("policy-{i}")}, "spec": spec})
}

#[flatnet_test(root)]
fn a_policy_change_reaches_a_pods_maps_on_a_cluster_of_1000_pods_and_500_policies() {
    let cluster = Cluster::new(&specs(&[(NODE, 1, Some("10.244.0.0/24"))]));
    let node = cluster.node(NODE);
    let served = ServedStub::start_in(&node.netns);
    let stub = &served.stub;
    for i in 0..NAMESPACES {
        stub.add(Kind::Namespace, namespace(i));
    }
    for i in REAL..PODS {
        stub.add(Kind::Pod, synthetic_pod(i));
    }
    for i in 0..POLICIES {
        stub.add(Kind::NetworkPolicy, api_policy(i, PORTS[0]));
    }
    node.start_agent(&Peers::Api(served.url.clone()));
    node.wait_ready();

    // The real pods, listed once kubelet reported their IPs.
    let real: Vec<_> = (0..REAL).map(|_| node.pod()).collect();
    for (i, pod) in real.iter().enumerate() {
        stub.add(Kind::Pod, cluster_pod(i, NODE, IpAddr::V4(pod.ip)));
    }
    assert_eq!(stub.list(Kind::Pod).len(), PODS);
    assert_eq!(stub.list(Kind::NetworkPolicy).len(), POLICIES);

    let computed =
        || metric(&node.metrics(), "flatnet_policy_compute_seconds_count").unwrap_or(0.0);
    let isolated = |direction: &str| {
        metric(
            &node.metrics(),
            &format!("flatnet_policy_isolated_pods{{direction=\"{direction}\"}}"),
        )
    };
    // Every real pod is isolated both ways (its namespace's default deny).
    wait_until("the real pods isolated", SETTLE, || {
        isolated("ingress") == Some(REAL as f64) && isolated("egress") == Some(REAL as f64)
    });
    let datapath = node.datapath();
    let slot = datapath
        .slot_of(IpAddr::V4(real[0].ip))
        .unwrap()
        .expect("pod-0's slot");
    // Whether pod-0's ingress table allows `port` (only policy-40 names it
    // when it is 8443).
    let allows = |port: i32| {
        let names = |direction: u32, ports: &flatnet_datapath::bpf::PolicyPorts| {
            direction == flatnet_common::POLICY_DIR_INGRESS
                && matches!(ports, flatnet_datapath::bpf::PolicyPorts::Ranges(ranges)
                    if ranges.iter().any(|r| i32::from(r.first) <= port && port <= i32::from(r.last)))
        };
        let by_prefix = datapath.pod_policy_rules(slot).unwrap();
        let by_identity = datapath.pod_policy_peers(slot).unwrap();
        by_prefix.iter().any(|(d, rule)| names(*d, &rule.ports))
            || by_identity.iter().any(|(d, rule)| names(*d, &rule.ports))
    };
    wait_until("pod-0's initial rules written", SETTLE, || {
        allows(PORTS[0]) && !allows(PORTS[1])
    });
    // Quiet: no computation for a while (the real pods' events are done).
    let mut last = computed();
    // Idle: no computation within a 500 ms window.
    wait_until("the agent idle", SETTLE, || {
        std::thread::sleep(Duration::from_millis(500));
        let now = computed();
        std::mem::replace(&mut last, now) == now
    });

    let mut times = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        let port = PORTS[(run + 1) % 2];
        let start = Instant::now();
        stub.modify(
            Kind::NetworkPolicy,
            &format!("ns-0/policy-{CHANGED}"),
            |p| {
                *p = api_policy(CHANGED, port);
            },
        );
        let landed = loop {
            if allows(PORTS[1]) == (port == PORTS[1]) {
                break Some(start.elapsed());
            }
            if start.elapsed() > SETTLE {
                break None;
            }
            // Polling the map: 1 ms is the measurement's resolution.
            std::thread::sleep(Duration::from_millis(1));
        };
        let elapsed = landed
            .unwrap_or_else(|| panic!("run {run}: policy-{CHANGED} on port {port} never landed"));
        times.push(elapsed);
        // The next change on an idle agent, as an operator's would be.
        std::thread::sleep(Duration::from_millis(100));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut sorted: Vec<f64> = times.iter().map(|t| ms(*t)).collect();
    sorted.sort_by(f64::total_cmp);
    let median = (sorted[(RUNS - 1) / 2] + sorted[RUNS / 2]) / 2.0;
    // The profile directory the agent was taken from (debug or release).
    let agent = bin("flatnet-agent");
    let build = agent
        .parent()
        .and_then(|dir| dir.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "policy event to maps: median {median:.1} ms, max {:.1} ms ({PODS} pods, {POLICIES} policies; \
         {build} agent; runs {:?} ms)",
        sorted[RUNS - 1],
        times
            .iter()
            .map(|t| ms(*t).round() as u64)
            .collect::<Vec<_>>()
    );
    assert_eq!(times.len(), RUNS);
    let page = node.metrics();
    assert_eq!(
        metric(&page, "flatnet_policy_errors_total"),
        Some(0.0),
        "{}",
        node.agent_log()
    );
    node.stop_agent();
    drop(real);
    drop(served);
}

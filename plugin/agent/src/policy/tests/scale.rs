//! How long [`plan`] takes on a cluster of realistic size: 1,000 pods on
//! 10 nodes in 20 namespaces, 500 policies (label-selected pods, some
//! namespace selectors, some ipBlocks with excepts, named ports, a
//! default deny per namespace). The agent recomputes the whole plan after
//! each (coalesced) watch event, so this is its latency per event.

use std::time::{Duration, Instant};

use super::*;

const NAMESPACES: usize = 20;
const PODS: usize = 1_000;
const POLICIES: usize = 500;
const NODES: usize = 10;
const APPS: usize = 10;

fn cluster_pods() -> Vec<Pod> {
    (0..PODS)
        .map(|i| {
            let ns = format!("ns-{}", i % NAMESPACES);
            let name = format!("pod-{i}");
            let node = if i % NODES == 0 {
                NODE.to_string()
            } else {
                format!("node-{}", i % NODES + 1)
            };
            let tier = ["web", "api", "db"][i % 3];
            let ip = format!("10.{}.{}.{}", 64 + i % NODES, i / 250, i % 250 + 2);
            pod(&ns, &name, &[&ip])
                .on(&node)
                .labels(json!({"app": format!("app-{}", i % APPS), "tier": tier, "pod": name}))
                .ports(&[("http", 8080, "TCP"), ("metrics", 9090, "TCP")])
                .build()
        })
        .collect()
}

fn cluster_namespaces() -> Vec<Namespace> {
    (0..NAMESPACES)
        .map(|i| {
            let env = if i % 2 == 0 { "prod" } else { "dev" };
            namespace(
                &format!("ns-{i}"),
                json!({"env": env, "team": format!("team-{}", i % 5)}),
            )
        })
        .collect()
}

/// Policy `i` (see `policy::scale_fixture`).
fn cluster_policy(i: usize, port: i32) -> NetworkPolicy {
    let except = format!("10.{}.0.0/16", 64 + i % NODES);
    let spec = crate::policy::scale_fixture::policy_spec(i, NAMESPACES, APPS, &except, port);
    policy(
        &format!("ns-{}", i % NAMESPACES),
        &format!("policy-{i}"),
        spec,
    )
}

/// The median of `runs` timed calls of `f`.
fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

#[test]
fn a_policy_event_on_a_cluster_of_1000_pods_and_500_policies_is_computed_quickly() {
    let pods = cluster_pods();
    let namespaces = cluster_namespaces();
    let mut policies: Vec<NetworkPolicy> = (0..POLICIES).map(|i| cluster_policy(i, 80)).collect();
    let before = plan(NODE, &policies, &pods, &namespaces);
    assert_eq!(before.pods.len(), PODS / NODES);
    assert!(before.pods.values().all(Result::is_ok), "{before:?}");

    // The event: one policy's port changes.
    policies[40] = cluster_policy(40, 8443);
    let mut after = Plan::default();
    let elapsed = median(5, || after = plan(NODE, &policies, &pods, &namespaces));
    let changed = after.changed_since(&before);
    assert!(!changed.is_empty());
    assert!(changed.len() < PODS / NODES, "{changed:?}");

    // Every pod of the whole cluster on this node: the worst case.
    let mut everything_here: Vec<Pod> = pods.clone();
    for p in &mut everything_here {
        p.node_name = Some(NODE.into());
    }
    let all = median(3, || {
        let plan = plan(NODE, &policies, &everything_here, &namespaces);
        assert_eq!(plan.pods.len(), PODS);
    });
    println!(
        "plan() after one policy event, {PODS} pods / {POLICIES} policies: \
         {elapsed:?} ({} pods on this node, {} changed); \
         with all {PODS} pods on this node: {all:?}",
        PODS / NODES,
        changed.len()
    );
    // Debug builds are some 10-30 times slower: the bound is for release.
    if !cfg!(debug_assertions) {
        assert!(elapsed < Duration::from_millis(50), "{elapsed:?}");
        assert!(all < Duration::from_millis(200), "{all:?}");
    }
}

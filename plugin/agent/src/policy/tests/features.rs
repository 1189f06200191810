//! Policy types, peers, which pods are subjects and peers, and the shape
//! of the result.

use serde_json::{Value, json};

use super::*;

fn namespaces() -> Vec<Namespace> {
    vec![
        namespace("x", json!({"team": "blue"})),
        namespace("y", json!({"team": "red"})),
    ]
}

fn pods() -> Vec<Pod> {
    vec![
        pod("x", "a", &["10.0.1.1"]).build(),
        pod("x", "b", &["10.0.1.2", "fd00::1:2"])
            .labels(json!({"pod": "b", "role": "db"}))
            .build(),
        pod("y", "c", &["10.0.2.3"]).on("node-2").build(),
    ]
}

fn isolation(plan: &Plan, pod: &str) -> (bool, bool) {
    let p = of(plan, pod);
    (p.ingress != Allowed::All, p.egress != Allowed::All)
}

#[test]
fn policy_types_default_as_upstream() {
    let cases: [(Value, (bool, bool)); 6] = [
        (json!({"podSelector": {}}), (true, false)),
        (json!({"podSelector": {}, "ingress": [{}]}), (true, false)),
        (json!({"podSelector": {}, "egress": [{}]}), (true, true)),
        (json!({"podSelector": {}, "egress": []}), (true, false)),
        (
            json!({"podSelector": {}, "policyTypes": [], "egress": [{}]}),
            (true, true),
        ),
        // Given types win; the other direction's rules are ignored.
        (
            json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]}),
            (false, true),
        ),
    ];
    for (spec, expected) in cases {
        let plan = plan(
            NODE,
            &[policy("x", "p", spec.clone())],
            &pods(),
            &namespaces(),
        );
        assert_eq!(isolation(&plan, "x/a"), expected, "{spec}");
    }
    let egress_only = json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]});
    let plan = plan(
        NODE,
        &[policy("x", "p", egress_only)],
        &pods(),
        &namespaces(),
    );
    assert_eq!(of(&plan, "x/a").egress, Allowed::Only(Table::default()));
}

#[test]
fn a_policy_selects_only_matching_pods_of_its_namespace() {
    let db = policy(
        "x",
        "db",
        json!({"podSelector": {"matchLabels": {"role": "db"}}}),
    );
    let other_namespace = policy("y", "all-of-y", json!({"podSelector": {}}));
    let exprs = policy(
        "x",
        "not-db",
        json!({"podSelector": {"matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}}),
    );
    let plan = plan(NODE, &[db, other_namespace, exprs], &pods(), &namespaces());
    assert_eq!(of(&plan, "x/a").policies, ["not-db"]);
    assert_eq!(of(&plan, "x/b").policies, ["db"]);
}

#[test]
fn empty_and_missing_peer_lists_mean_everywhere() {
    for rule in [
        json!({}),
        json!({"from": []}),
        json!({"from": null, "ports": null}),
    ] {
        let p = policy("x", "p", json!({"podSelector": {}, "ingress": [rule]}));
        let plan = plan(NODE, &[p], &pods(), &namespaces());
        assert_eq!(
            entries(&of(&plan, "x/a").ingress),
            ["0.0.0.0/0 any", "::/0 any"],
            "{rule}"
        );
    }
}

#[test]
fn peers_of_each_kind() {
    let from = |peers: Value| {
        let p = policy(
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": peers}]}),
        );
        entries(&of(&plan(NODE, &[p], &pods(), &namespaces()), "x/a").ingress)
    };
    // An empty podSelector: every pod of the policy's namespace.
    assert_eq!(
        from(json!([{"podSelector": {}}])),
        ["10.0.1.1/32 any", "10.0.1.2/32 any", "fd00::1:2/128 any"]
    );
    // An empty namespaceSelector: every pod anywhere.
    assert_eq!(from(json!([{"namespaceSelector": {}}])).len(), 4);
    assert_eq!(
        from(json!([{"namespaceSelector": {"matchLabels": {"team": "red"}}}])),
        ["10.0.2.3/32 any"]
    );
    assert_eq!(
        from(json!([{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "db"}}}])),
        ["10.0.1.2/32 any", "fd00::1:2/128 any"]
    );
    // Peers the API server would reject match nothing.
    for bad in [
        json!([{}]),
        json!([{"ipBlock": {"cidr": "10.0.0.0/33"}}]),
        json!([{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["bogus"]}}]),
    ] {
        assert!(from(bad.clone()).is_empty(), "{bad}");
    }
}

#[test]
fn a_namespace_not_seen_yet_matches_by_its_name_only() {
    let p = policy(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}
        ]}]}),
    );
    let plan = plan(NODE, &[p], &pods(), &[]);
    assert_eq!(entries(&of(&plan, "x/a").ingress), ["10.0.2.3/32 any"]);
}

#[test]
fn subjects_are_this_nodes_running_pods_without_host_network() {
    let pods = vec![
        pod("x", "local", &["10.0.1.1"]).build(),
        pod("x", "new", &[]).build(),
        pod("x", "remote", &["10.0.2.1"]).on("node-2").build(),
        pod("x", "host", &["192.168.0.1"]).host_network().build(),
        pod("x", "done", &["10.0.1.9"]).phase("Succeeded").build(),
    ];
    let plan = plan(NODE, &[], &pods, &namespaces());
    let keys: Vec<String> = plan.pods.keys().map(ToString::to_string).collect();
    assert_eq!(keys, ["x/local", "x/new"]);
    assert!(of(&plan, "x/new").ips.is_empty());
}

#[test]
fn peers_are_pods_with_ips_that_have_not_finished_host_network_included() {
    let pods = vec![
        pod("x", "a", &["10.0.1.1"]).build(),
        pod("x", "host", &["192.168.0.1"])
            .host_network()
            .on("node-2")
            .build(),
        pod("x", "new", &[]).build(),
        pod("x", "failed", &["10.0.1.8"]).phase("Failed").build(),
        pod("x", "done", &["10.0.1.9"]).phase("Succeeded").build(),
        pod("x", "pending", &["10.0.1.7"]).phase("Pending").build(),
    ];
    let p = policy(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {}}]}]}),
    );
    let plan = plan(NODE, &[p], &pods, &namespaces());
    assert_eq!(
        entries(&of(&plan, "x/a").ingress),
        ["10.0.1.1/32 any", "10.0.1.7/32 any", "192.168.0.1/32 any"]
    );
}

#[test]
fn pod_ip_is_used_when_pod_ips_is_missing() {
    let mut p = pod("x", "a", &[]);
    p.json["status"]["podIP"] = json!("10.0.1.1");
    let plan = plan(NODE, &[], &[p.build()], &[]);
    assert_eq!(of(&plan, "x/a").ips, [ip("10.0.1.1")]);
}

#[test]
fn the_result_does_not_depend_on_input_order() {
    let policies = vec![
        policy(
            "x",
            "one",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": 80}]}]}),
        ),
        policy(
            "x",
            "two",
            json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "serve-81-tcp"}]}]}),
        ),
        policy(
            "x",
            "three",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}),
        ),
    ];
    let forward = plan(NODE, &policies, &pods(), &namespaces());
    let mut reversed_pods = pods();
    reversed_pods.reverse();
    let mut reversed_policies = policies.clone();
    reversed_policies.reverse();
    let mut reversed_namespaces = namespaces();
    reversed_namespaces.reverse();
    let backward = plan(
        NODE,
        &reversed_policies,
        &reversed_pods,
        &reversed_namespaces,
    );
    assert_eq!(forward, backward);
    assert_eq!(of(&forward, "x/a").policies, ["one", "three", "two"]);
}

#[test]
fn changed_since_names_only_the_pods_whose_result_differs() {
    let deny_db = policy(
        "x",
        "deny-db",
        json!({"podSelector": {"matchLabels": {"role": "db"}}}),
    );
    let before = plan(NODE, &[], &pods(), &namespaces());
    assert!(before.changed_since(&before).is_empty());
    let after = plan(NODE, std::slice::from_ref(&deny_db), &pods(), &namespaces());
    assert_eq!(after.changed_since(&before), [key("x/b")]);
    // A pod that went away counts as changed, and so does a new one.
    let fewer = plan(NODE, &[deny_db], &pods()[1..], &namespaces());
    assert_eq!(fewer.changed_since(&after), [key("x/a")]);
    assert_eq!(after.changed_since(&fewer), [key("x/a")]);
}

#[test]
fn ipv6_peers_get_host_routes_of_128() {
    let p = policy(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"podSelector": {"matchLabels": {"role": "db"}}}]}]}),
    );
    let plan = plan(NODE, &[p], &pods(), &namespaces());
    let egress = &of(&plan, "x/a").egress;
    assert_eq!(entries(egress), ["10.0.1.2/32 any", "fd00::1:2/128 any"]);
    assert!(egress.allows(ip("fd00::1:2"), TCP, 5432));
    assert!(!egress.allows(ip("fd00::1:3"), TCP, 5432));
}

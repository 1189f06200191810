//! How the policy state grows: with pods plus rules, not their product.
//! Local pods' tables name peers by identity, and the node keeps one
//! address entry per peer pod whose identity a table names.

use super::*;

/// Entries the node's maps hold for `plan`: prefix and identity entries of
/// every local pod's tables, and the peer addresses.
fn map_entries(plan: &Plan) -> usize {
    let tables: usize = plan
        .pods
        .values()
        .flatten()
        .flat_map(|p| [&p.ingress, &p.egress])
        .map(|a| match a {
            Allowed::All => 0,
            Allowed::Only(t) => t.entries.len() + t.peers.len(),
        })
        .sum();
    tables + plan.addresses.len()
}

/// `servers` pods here in namespace `app`, selected by a policy that lets
/// namespace `clients` in; `clients` client pods of one Deployment on
/// another node, every other address of its pod CIDR.
fn cluster(servers: usize, clients: usize) -> (Vec<NetworkPolicy>, Vec<Pod>, Vec<Namespace>) {
    let admit = policy(
        "app",
        "from-clients",
        json!({"podSelector": {"matchLabels": {"app": "server"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"role": "clients"}}}]}]}),
    );
    let mut pods: Vec<Pod> = (0..servers)
        .map(|i| {
            let ip = format!("10.1.0.{}", i + 2);
            pod("app", &format!("server-{i}"), &[&ip])
                .labels(json!({"app": "server"}))
                .build()
        })
        .collect();
    pods.extend((0..clients).map(|i| client(i).build()));
    let namespaces = vec![
        namespace("app", json!({})),
        namespace("clients", json!({"role": "clients"})),
    ];
    (vec![admit], pods, namespaces)
}

fn client(i: usize) -> TestPod {
    let n = 2 * i + 2;
    let ip = format!("10.2.{}.{}", n / 256, n % 256);
    pod("clients", &format!("client-{i}"), &[&ip])
        .on("node-2")
        .labels(json!({"app": "client", "pod-template-hash": "5d8f7c"}))
}

#[test]
fn sixteen_pods_that_admit_a_namespace_of_5000_pods_take_16_plus_5000_entries() {
    let (policies, pods, namespaces) = cluster(16, 5000);
    let plan = plan(NODE, &policies, &pods, &namespaces);
    assert_eq!(plan.pods.len(), 16);
    let identities: BTreeSet<u32> = plan.addresses.values().copied().collect();
    assert_eq!(identities.len(), 1, "one Deployment, one identity");
    for i in 0..16 {
        let ingress = &of(&plan, &format!("app/server-{i}")).ingress;
        let t = table(ingress.allowed);
        assert!(t.entries.is_empty(), "{t:?}");
        assert_eq!(t.peers.len(), 1);
        assert!(ingress.allows(ip("10.2.0.2"), TCP, 80));
        assert!(ingress.allows(ip("10.2.39.16"), TCP, 80), "client 4999");
        assert!(!ingress.allows(ip("10.2.0.3"), TCP, 80), "no pod there");
    }
    // Per address before (16 x 5,000 = 80,000, more than a node held).
    assert_eq!(map_entries(&plan), 16 + 5000);
}

/// Plans one after the other, as the agent makes them: identity numbers
/// kept from one to the next.
fn planner(policies: &[NetworkPolicy], namespaces: &[Namespace]) -> impl FnMut(&[Pod]) -> Plan {
    let mut numbers = identity::IdentityNumbers::default();
    move |pods: &[Pod]| {
        let policies: Vec<&NetworkPolicy> = policies.iter().collect();
        let pods: Vec<&Pod> = pods.iter().collect();
        let namespaces: Vec<&Namespace> = namespaces.iter().collect();
        let objects = (&policies[..], &pods[..], &namespaces[..]);
        plan_of(NODE, objects, &[], &LocalIps::default(), &mut numbers)
    }
}

#[test]
fn a_peer_pod_coming_or_going_rewrites_no_table() {
    let (policies, mut pods, namespaces) = cluster(16, 100);
    let mut plan_now = planner(&policies, &namespaces);
    let before = plan_now(&pods);
    pods.push(client(100).build());
    let after = plan_now(&pods);
    assert_eq!(after.changed_since(&before), Vec::<PodKey>::new());
    assert_eq!(after.addresses.len(), before.addresses.len() + 1);
    let new = after.addresses[&ip("10.2.0.202")];
    assert_eq!(
        Some(&new),
        before.addresses.values().next(),
        "same identity"
    );

    // A label no selector mentions does not split the identity.
    pods.last_mut().unwrap().labels = pod::labels(BTreeMap::from([
        ("app".into(), "client".into()),
        ("version".into(), "2".into()),
    ]));
    let relabelled = plan_now(&pods);
    assert_eq!(relabelled, after);

    // Gone: one address less, no table rewritten.
    pods.pop();
    let gone = plan_now(&pods);
    assert_eq!(gone.changed_since(&after), Vec::<PodKey>::new());
    assert_eq!(gone.addresses, before.addresses);
}

#[test]
fn a_pod_whose_selected_label_changes_changes_identity() {
    let spec = json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]});
    let pods = |role: &str| {
        vec![
            pod("x", "server", &["10.0.0.2"]).build(),
            pod("x", "a", &["10.0.1.2"])
                .on("node-2")
                .labels(json!({"role": "client"}))
                .build(),
            pod("x", "b", &["10.0.1.3"])
                .on("node-2")
                .labels(json!({"role": role}))
                .build(),
        ]
    };
    let policies = [policy("x", "p", spec)];
    let namespaces = [namespace("x", json!({}))];
    let mut plan_now = planner(&policies, &namespaces);
    let both = plan_now(&pods("client"));
    assert!(
        of(&both, "x/server")
            .ingress
            .allows(ip("10.0.1.3"), TCP, 80)
    );
    assert_eq!(
        both.addresses[&ip("10.0.1.2")],
        both.addresses[&ip("10.0.1.3")]
    );
    let one = plan_now(&pods("batch"));
    assert!(!of(&one, "x/server").ingress.allows(ip("10.0.1.3"), TCP, 80));
    assert!(
        !one.addresses.contains_key(&ip("10.0.1.3")),
        "named by no table"
    );
    assert_eq!(one.changed_since(&both), Vec::<PodKey>::new());
}

/// Host-network pods share their node's address: a selector that matches
/// one of them allows the address, with that pod's named ports.
#[test]
fn an_address_shared_by_host_network_pods_is_matched_through_any_of_them() {
    let spec = json!({"podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"podSelector": {"matchLabels": {"role": "agent"}}}], "ports": [{"port": "metrics"}]}]});
    let pods = [
        pod("x", "me", &["10.0.0.2"]).build(),
        pod("x", "agent", &["192.168.0.2"])
            .on("node-2")
            .host_network()
            .labels(json!({"role": "agent"}))
            .ports(&[("metrics", 9100, "TCP")])
            .build(),
        pod("x", "other", &["192.168.0.2"])
            .on("node-2")
            .host_network()
            .labels(json!({"role": "other"}))
            .ports(&[("metrics", 9999, "TCP")])
            .build(),
    ];
    let plan = plan(
        NODE,
        &[policy("x", "p", spec)],
        &pods,
        &[namespace("x", json!({}))],
    );
    let egress = &of(&plan, "x/me").egress;
    assert!(egress.allows(ip("192.168.0.2"), TCP, 9100));
    assert!(
        !egress.allows(ip("192.168.0.2"), TCP, 9999),
        "not the agent's port"
    );
    assert_eq!(entries(egress), ["192.168.0.2/32 tcp/9100"]);
}

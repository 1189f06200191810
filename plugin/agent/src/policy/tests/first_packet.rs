//! What a new pod starts with before its policy is written, and the
//! addresses ADD recorded for pods the API has none of yet.

use super::*;

#[test]
fn namespaces_isolate_the_union_of_their_policies_types() {
    let policies = [
        policy("a", "ingress-only", json!({"podSelector": {}})),
        policy(
            "a",
            "egress-too",
            json!({"podSelector": {"matchLabels": {"pod": "x"}}, "egress": [{}]}),
        ),
        policy(
            "b",
            "egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        ),
        policy("c", "none", json!({"podSelector": {}, "policyTypes": []})),
    ];
    let refs: Vec<&NetworkPolicy> = policies.iter().collect();
    let isolation = isolation(&refs);
    assert!(isolation.listed);
    let of = |ns: &str| isolation.namespaces.get(ns).map(|d| (d.ingress, d.egress));
    assert_eq!(of("a"), Some((true, true)));
    assert_eq!(of("b"), Some((false, true)));
    // Empty policyTypes default to Ingress, as upstream does.
    assert_eq!(of("c"), Some((true, false)));
    assert_eq!(of("d"), None);
}

#[test]
fn a_local_pod_without_an_address_in_the_api_takes_the_one_add_recorded() {
    let policies = [policy(
        "x",
        "from-client",
        json!({"podSelector": {"matchLabels": {"pod": "server"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "client"}}}]}]}),
    )];
    let pods = [
        pod("x", "server", &["10.0.0.2"]).build(),
        // Just added: kubelet has not reported an address yet.
        pod("x", "client", &[]).build(),
        pod("x", "elsewhere", &[]).on("node-2").build(),
    ];
    let namespaces = [namespace("x", json!({}))];
    let plan_with = |local: &LocalIps| {
        plan_of(
            NODE,
            (
                &policies.iter().collect::<Vec<_>>(),
                &pods.iter().collect::<Vec<_>>(),
                &namespaces.iter().collect::<Vec<_>>(),
            ),
            &[],
            local,
            &mut identity::IdentityNumbers::default(),
        )
    };
    let without = plan_with(&LocalIps::default());
    assert!(of(&without, "x/client").ips.is_empty());
    assert!(entries(&of(&without, "x/server").ingress).is_empty());

    let mut local = LocalIps {
        node: NODE.into(),
        ..Default::default()
    };
    local
        .ips
        .insert(("x".into(), "client".into()), vec![ip("10.0.0.3")]);
    // A record of another node's pod is not this node's to trust.
    local
        .ips
        .insert(("x".into(), "elsewhere".into()), vec![ip("10.0.0.9")]);
    let with = plan_with(&local);
    assert_eq!(of(&with, "x/client").ips, vec![ip("10.0.0.3")]);
    assert_eq!(
        entries(&of(&with, "x/server").ingress),
        vec!["10.0.0.3/32 any"]
    );
}

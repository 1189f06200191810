//! The upstream e2e NetworkPolicy cases, each probed 9x9 and compared with
//! the model.

use super::*;

#[flatnet_test(root)]
fn the_upstream_e2e_policy_cases_match_the_model() {
    let cluster = cluster();
    let world = World::new(&cluster);
    // Sanity: the pods are where they should be, spread over both nodes,
    // and without policy everything is allowed.
    assert!(world.pod("x/a").ip.octets()[2] != world.pod("x/b").ip.octets()[2]);
    world.check("no policy", false);

    world.case(
        "default deny ingress (x)",
        vec![policy(
            "x",
            "deny-ingress",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )],
    );
    world.case(
        "default deny egress (x)",
        vec![policy(
            "x",
            "deny-egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        )],
    );
    // Deny everything both ways in x, then allow all ingress: the union
    // lets all in, egress stays denied.
    world.case(
        "deny all in x, allow all ingress",
        vec![
            policy(
                "x",
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            ),
            policy(
                "x",
                "allow-all-ingress",
                json!({"podSelector": {}, "ingress": [{}]}),
            ),
        ],
    );
    world.case(
        "allow ingress to x/a from namespace y",
        vec![policy(
            "x",
            "a-from-y",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        )],
    );
    world.case(
        "ingress to x/a from pod b in namespaces y or z (AND in one peer)",
        vec![policy(
            "x",
            "a-from-b-in-yz",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [{
                       "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]},
                       "podSelector": only("b")}]}]}),
        )],
    );
    world.case(
        "ingress to x/a from namespace y or pod b of x (OR of two peers)",
        vec![policy(
            "x",
            "a-from-y-or-b",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [
                       {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}},
                       {"podSelector": only("b")}]}]}),
        )],
    );
    // worker-1's pods, less one of them.
    let excepted = world.pod("y/a").ip;
    assert_eq!(world.pod("y/a").node, "worker-1");
    world.case(
        "ingress to x from an ipBlock with except",
        vec![policy(
            "x",
            "from-worker-1-block",
            json!({"podSelector": {},
                   "ingress": [{"from": [{"ipBlock": {"cidr": NODES[1].2, "except": [format!("{excepted}/32")]}}]}]}),
        )],
    );
    world.case(
        "egress of y to an ipBlock (cp-1's pods)",
        vec![policy(
            "y",
            "to-cp-1-block",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": NODES[0].2}}]}]}),
        )],
    );
    world.case(
        "named ports: ingress to x/a on serve-81-tcp, egress of x/b to serve-80-udp",
        vec![
            policy(
                "x",
                "a-named",
                json!({"podSelector": only("a"),
                       "ingress": [{"ports": [{"port": "serve-81-tcp", "protocol": "TCP"}]}]}),
            ),
            policy(
                "x",
                "b-named-egress",
                json!({"podSelector": only("b"), "policyTypes": ["Egress"],
                       "egress": [{"ports": [{"port": "serve-80-udp", "protocol": "UDP"}]}]}),
            ),
        ],
    );
    world.case(
        "endPort: ingress to y/a on TCP 79-80 and UDP 81-82",
        vec![policy(
            "y",
            "a-ranges",
            json!({"podSelector": only("a"),
                   "ingress": [{"ports": [
                       {"port": 79, "endPort": 80, "protocol": "TCP"},
                       {"port": 81, "endPort": 82, "protocol": "UDP"}]}]}),
        )],
    );
    world.case(
        "two policies on z/c (union)",
        vec![
            policy(
                "z",
                "c-from-x-tcp-80",
                json!({"podSelector": only("c"),
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}],
                                    "ports": [{"port": 80}]}]}),
            ),
            policy(
                "z",
                "c-from-pods-a",
                json!({"podSelector": only("c"),
                       "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": only("a")}]}]}),
            ),
        ],
    );
    world.case(
        "ingress and egress: z/b from x only, to y only on UDP",
        vec![policy(
            "z",
            "b-both",
            json!({"podSelector": only("b"), "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}],
                   "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                               "ports": [{"protocol": "UDP"}]}]}),
        )],
    );
    world.check("all policies gone", false);
}

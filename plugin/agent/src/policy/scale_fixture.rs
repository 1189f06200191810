//! The NetworkPolicies of a cluster of realistic size, one generator for
//! two measurements: the agent's scale test (`policy::tests::scale`) and
//! the integration test of policy latency
//! (`tests/tests/integration/policy_latency.rs`) both build them here, so
//! the two measure the same policies.

use serde_json::{Value, json};

/// The spec of policy `i` of a cluster with `namespaces` namespaces and
/// `apps` apps: a default deny for each namespace (the first
/// `namespaces`), the others allowing traffic to an app from pods of a
/// tier, from monitoring namespaces, and to and from address blocks;
/// `except` is the block the egress allowance of 10.0.0.0/8 leaves out,
/// `port` the numbered port the rules name.
pub fn policy_spec(i: usize, namespaces: usize, apps: usize, except: &str, port: i32) -> Value {
    if i < namespaces {
        return json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]});
    }
    let app = format!("app-{}", i % apps);
    match i % 4 {
        0 => json!({
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {"tier": "web"}}}],
                "ports": [{"port": port}, {"port": "http"}]
            }]
        }),
        1 => json!({
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [{
                "from": [{
                    "namespaceSelector": {"matchLabels": {"env": "prod"}},
                    "podSelector": {"matchExpressions": [
                        {"key": "tier", "operator": "In", "values": ["api", "web"]}
                    ]}
                }],
                "ports": [{"port": "metrics"}]
            }]
        }),
        2 => json!({
            "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": [app]}]},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [except]}}],
                 "ports": [{"port": port, "endPort": port + 10}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"team": format!("team-{}", i % 5)}}}],
                 "ports": [{"port": "http"}, {"port": 53, "protocol": "UDP"}]}
            ]
        }),
        _ => json!({
            "podSelector": {"matchLabels": {"tier": "db"}},
            "ingress": [{
                "from": [
                    {"ipBlock": {"cidr": format!("192.168.{}.0/24", i % 200)}},
                    {"podSelector": {"matchLabels": {"app": app, "tier": "api"}}}
                ],
                "ports": [{"port": 5432}]
            }]
        }),
    }
}

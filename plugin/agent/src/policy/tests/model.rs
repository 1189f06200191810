//! The model of upstream's NetworkPolicy e2e tests: namespaces x, y, z
//! with pods a, b, c each, all on this node, dual-stack. A truth table row
//! says what one pod can reach: `.` allowed, `X` denied, in the order
//! x/a x/b x/c y/a y/b y/c z/a z/b z/c.

use serde_json::{Value, json};

use super::*;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];

fn address(pod: &str, v6: bool) -> IpAddr {
    let (namespace, name) = pod.split_once('/').unwrap();
    let n = NAMESPACES.iter().position(|x| *x == namespace).unwrap() + 1;
    let p = PODS.iter().position(|x| *x == name).unwrap() + 1;
    if v6 {
        ip(&format!("fd00::{n}:{p}"))
    } else {
        ip(&format!("10.0.{n}.{p}"))
    }
}

fn all_pods() -> Vec<String> {
    NAMESPACES
        .iter()
        .flat_map(|n| PODS.iter().map(move |p| format!("{n}/{p}")))
        .collect()
}

/// The plan for the model with `policies`.
fn model(policies: &[NetworkPolicy]) -> Plan {
    let pods: Vec<Pod> = all_pods()
        .iter()
        .map(|p| {
            let (namespace, name) = p.split_once('/').unwrap();
            let ips = [address(p, false).to_string(), address(p, true).to_string()];
            pod(namespace, name, &[&ips[0], &ips[1]]).build()
        })
        .collect();
    let namespaces: Vec<Namespace> = NAMESPACES
        .iter()
        .map(|n| namespace(n, json!({"ns": n})))
        .collect();
    plan(NODE, policies, &pods, &namespaces)
}

/// Who reaches whom over one family: the sender's egress must allow the
/// receiver's address and the receiver's ingress the sender's.
fn reachability_of(plan: &Plan, v6: bool, protocol: u8, port: u16) -> Vec<String> {
    let pods = all_pods();
    pods.iter()
        .map(|from| {
            let cells: String = pods
                .iter()
                .map(|to| {
                    let out = of(plan, from)
                        .egress
                        .allows(address(to, v6), protocol, port);
                    let inn = of(plan, to)
                        .ingress
                        .allows(address(from, v6), protocol, port);
                    if out && inn { '.' } else { 'X' }
                })
                .collect();
            format!("{from} {cells}")
        })
        .collect()
}

/// The truth table, the same for IPv4 and IPv6.
fn reachability(plan: &Plan, protocol: u8, port: u16) -> Vec<String> {
    let v4 = reachability_of(plan, false, protocol, port);
    assert_eq!(
        v4,
        reachability_of(plan, true, protocol, port),
        "IPv4 and IPv6 differ"
    );
    v4
}

const ALL: [&str; 9] = [
    "x/a .........",
    "x/b .........",
    "x/c .........",
    "y/a .........",
    "y/b .........",
    "y/c .........",
    "z/a .........",
    "z/b .........",
    "z/c .........",
];

/// Ingress to x/a from the rows marked in `from` ("x/b y/c").
fn only_into_xa_from(from: &str) -> Vec<String> {
    all_pods()
        .iter()
        .map(|p| {
            let cell = if from.split(' ').any(|f| f == p) {
                '.'
            } else {
                'X'
            };
            format!("{p} {cell}........")
        })
        .collect()
}

fn into_xa(from: Value, ports: Value) -> NetworkPolicy {
    policy(
        "x",
        "into-xa",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": from, "ports": ports}]}),
    )
}

#[test]
fn without_policies_everything_is_allowed() {
    let plan = model(&[]);
    assert_eq!(plan.pods.len(), 9);
    assert_eq!(reachability(&plan, TCP, 80), ALL);
    let xa = of(&plan, "x/a");
    assert_eq!((&*xa.ingress, &*xa.egress), (&Allowed::All, &Allowed::All));
    assert!(xa.policies.is_empty());
    assert_eq!(xa.ips, [ip("10.0.1.1"), ip("fd00::1:1")]);
}

#[test]
fn default_deny_ingress() {
    let deny = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let plan = model(&[deny]);
    let expected: Vec<String> = all_pods()
        .iter()
        .map(|p| format!("{p} XXX......"))
        .collect();
    assert_eq!(reachability(&plan, TCP, 80), expected);
    assert_eq!(of(&plan, "x/b").ingress, Allowed::Only(Table::default()));
    assert_eq!(of(&plan, "x/b").egress, Allowed::All);
    assert_eq!(of(&plan, "x/b").policies, ["deny"]);
    assert!(of(&plan, "y/b").policies.is_empty());
}

#[test]
fn default_deny_egress() {
    let deny = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    );
    let plan = model(&[deny]);
    let mut expected = ALL.map(String::from).to_vec();
    for row in &mut expected[..3] {
        *row = format!("{} XXXXXXXXX", &row[..3]);
    }
    assert_eq!(reachability(&plan, TCP, 80), expected);
    assert_eq!(of(&plan, "x/a").ingress, Allowed::All);
}

#[test]
fn allow_all_after_default_deny() {
    let deny = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    let allow = policy(
        "x",
        "allow",
        json!({"podSelector": {}, "ingress": [{}], "egress": [{}]}),
    );
    let plan = model(&[deny, allow]);
    assert_eq!(reachability(&plan, TCP, 80), ALL);
    assert_eq!(reachability(&plan, 1, 0), ALL, "ICMP too");
    let xa = of(&plan, "x/a");
    assert_eq!(entries(&xa.ingress), ["0.0.0.0/0 any", "::/0 any"]);
    assert_eq!(entries(&xa.egress), ["0.0.0.0/0 any", "::/0 any"]);
    assert_eq!(xa.policies, ["allow", "deny"]);
}

#[test]
fn allow_from_one_namespace() {
    let plan = model(&[into_xa(
        json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]),
        json!(null),
    )]);
    assert_eq!(
        reachability(&plan, TCP, 80),
        only_into_xa_from("y/a y/b y/c")
    );
    assert_eq!(
        entries(&of(&plan, "x/a").ingress),
        [
            "10.0.2.1/32 any",
            "10.0.2.2/32 any",
            "10.0.2.3/32 any",
            "fd00::2:1/128 any",
            "fd00::2:2/128 any",
            "fd00::2:3/128 any"
        ]
    );
}

#[test]
fn pod_and_namespace_selector_in_one_peer_mean_both() {
    let peer = json!([{
        "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]},
        "podSelector": {"matchLabels": {"pod": "b"}}
    }]);
    let plan = model(&[into_xa(peer, json!(null))]);
    assert_eq!(reachability(&plan, TCP, 80), only_into_xa_from("y/b z/b"));
}

#[test]
fn pod_and_namespace_selector_as_two_peers_mean_either() {
    let peers = json!([
        {"namespaceSelector": {"matchLabels": {"ns": "y"}}},
        {"podSelector": {"matchLabels": {"pod": "b"}}}
    ]);
    let plan = model(&[into_xa(peers, json!(null))]);
    // The podSelector alone picks pods of the policy's namespace only.
    assert_eq!(
        reachability(&plan, TCP, 80),
        only_into_xa_from("x/b y/a y/b y/c")
    );
}

#[test]
fn ip_block_with_except() {
    let peers = json!([
        {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.2.0/24", "10.0.3.3/32"]}},
        {"ipBlock": {"cidr": "fd00::/96", "except": ["fd00::2:0/112", "fd00::3:3/128"]}}
    ]);
    let plan = model(&[into_xa(peers, json!(null))]);
    assert_eq!(
        reachability(&plan, TCP, 80),
        only_into_xa_from("x/a x/b x/c z/a z/b")
    );
    assert_eq!(
        entries(&of(&plan, "x/a").ingress),
        [
            "10.0.0.0/16 any",
            "10.0.2.0/24 none",
            "10.0.3.3/32 none",
            "fd00::/96 any",
            "fd00::2:0/112 none",
            "fd00::3:3/128 none"
        ]
    );
}

#[test]
fn named_port_on_ingress() {
    let plan = model(&[into_xa(json!(null), json!([{"port": "serve-81-tcp"}]))]);
    assert_eq!(reachability(&plan, TCP, 81), ALL);
    assert_eq!(reachability(&plan, TCP, 80), only_into_xa_from(""));
    assert_eq!(reachability(&plan, UDP, 81), only_into_xa_from(""));
    assert_eq!(
        entries(&of(&plan, "x/a").ingress),
        ["0.0.0.0/0 tcp/81", "::/0 tcp/81"]
    );
}

#[test]
fn named_port_on_egress() {
    let to_y = policy(
        "x",
        "to-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [{
            "to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
            "ports": [{"port": "serve-81-udp", "protocol": "UDP"}]
        }]}),
    );
    let plan = model(&[to_y]);
    let row = |udp81: &str| {
        let mut rows = ALL.map(String::from).to_vec();
        rows[0] = format!("x/a {udp81}");
        rows
    };
    assert_eq!(reachability(&plan, UDP, 81), row("XXX...XXX"));
    assert_eq!(reachability(&plan, TCP, 81), row("XXXXXXXXX"));
}

#[test]
fn end_port_range() {
    let plan = model(&[into_xa(json!(null), json!([{"port": 80, "endPort": 81}]))]);
    for port in [80, 81] {
        assert_eq!(reachability(&plan, TCP, port), ALL);
    }
    for (protocol, port) in [(TCP, 79), (TCP, 82), (UDP, 80)] {
        assert_eq!(reachability(&plan, protocol, port), only_into_xa_from(""));
    }
    assert_eq!(
        entries(&of(&plan, "x/a").ingress),
        ["0.0.0.0/0 tcp/80-81", "::/0 tcp/80-81"]
    );
}

#[test]
fn two_policies_add_up() {
    let from = |name: &str, namespace: &str, port: u16| {
        let peer = json!([{"namespaceSelector": {"matchLabels": {"ns": namespace}}}]);
        let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": peer, "ports": [{"port": port}]}]});
        policy("x", name, spec)
    };
    let plan = model(&[
        from("from-z-81", "z", 81),
        from("from-y-80", "y", 80),
        from("from-z-80", "z", 80),
    ]);
    assert_eq!(
        reachability(&plan, TCP, 80),
        only_into_xa_from("y/a y/b y/c z/a z/b z/c")
    );
    assert_eq!(
        reachability(&plan, TCP, 81),
        only_into_xa_from("z/a z/b z/c")
    );
    assert_eq!(
        of(&plan, "x/a").policies,
        ["from-y-80", "from-z-80", "from-z-81"]
    );
    assert!(entries(&of(&plan, "x/a").ingress).contains(&"10.0.3.1/32 tcp/80-81".to_string()));
}

#[test]
fn egress_to_udp_53_only() {
    let dns = policy(
        "x",
        "dns-only",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}),
    );
    let plan = model(&[dns]);
    let mut expected = ALL.map(String::from).to_vec();
    for row in &mut expected[..3] {
        *row = format!("{} XXXXXXXXX", &row[..3]);
    }
    assert_eq!(reachability(&plan, TCP, 80), expected);
    assert_eq!(reachability(&plan, TCP, 53), expected);
    assert_eq!(reachability(&plan, UDP, 53), ALL);
    assert_eq!(
        entries(&of(&plan, "x/c").egress),
        ["0.0.0.0/0 udp/53", "::/0 udp/53"]
    );
    assert_eq!(of(&plan, "x/c").ingress, Allowed::All);
}

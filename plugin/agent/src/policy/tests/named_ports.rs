//! Ports: named ports resolved on the destination, protocols, ranges, and
//! the limit on ranges per entry.

use serde_json::json;

use super::*;

/// x/me on this node; in y, b serves "web" on 8080, c on TCP 9090 and UDP
/// 9091, a has no "web"; in z, d serves "web" on 7070.
fn cluster() -> (Vec<Pod>, Vec<Namespace>) {
    let pods = vec![
        pod("x", "me", &["10.0.1.1"])
            .ports(&[("web", 8443, "TCP")])
            .build(),
        pod("y", "a", &["10.0.2.1"])
            .on("node-2")
            .ports(&[("other", 80, "TCP")])
            .build(),
        pod("y", "b", &["10.0.2.2", "fd00::2:2"])
            .on("node-2")
            .ports(&[("web", 8080, "TCP")])
            .build(),
        pod("y", "c", &["10.0.2.3"])
            .on("node-2")
            .ports(&[("web", 9090, "TCP"), ("web", 9091, "UDP")])
            .build(),
        pod("z", "d", &["10.0.3.4"])
            .on("node-2")
            .ports(&[("web", 7070, "TCP")])
            .build(),
    ];
    let namespaces = ["x", "y", "z"].map(|n| namespace(n, json!({}))).to_vec();
    (pods, namespaces)
}

fn egress(to: serde_json::Value, ports: serde_json::Value) -> Plan {
    let p = policy(
        "x",
        "out",
        json!({"podSelector": {}, "egress": [{"to": to, "ports": ports}]}),
    );
    let (pods, namespaces) = cluster();
    plan(NODE, &[p], &pods, &namespaces)
}

#[test]
fn an_egress_named_port_becomes_an_entry_per_peer_pod() {
    let to_y =
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]);
    let plan = egress(to_y, json!([{"port": "web"}]));
    assert_eq!(
        entries(&of(&plan, "x/me").egress),
        [
            "10.0.2.2/32 tcp/8080",
            "10.0.2.3/32 tcp/9090",
            "fd00::2:2/128 tcp/8080"
        ]
    );
}

#[test]
fn named_and_numbered_ports_of_one_egress_rule_combine_per_peer() {
    let to_y =
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]);
    let plan = egress(
        to_y,
        json!([{"port": "web", "protocol": "UDP"}, {"port": 53, "protocol": "UDP"}]),
    );
    assert_eq!(
        entries(&of(&plan, "x/me").egress),
        [
            "10.0.2.1/32 udp/53",
            "10.0.2.2/32 udp/53",
            "10.0.2.3/32 udp/53,udp/9091",
            "fd00::2:2/128 udp/53"
        ]
    );
}

#[test]
fn an_egress_named_port_to_everywhere_means_every_pod_with_it() {
    let plan = egress(json!(null), json!([{"port": "web"}, {"port": 443}]));
    assert_eq!(
        entries(&of(&plan, "x/me").egress),
        [
            "0.0.0.0/0 tcp/443",
            "10.0.1.1/32 tcp/443,tcp/8443",
            "10.0.2.2/32 tcp/443,tcp/8080",
            "10.0.2.3/32 tcp/443,tcp/9090",
            "10.0.3.4/32 tcp/443,tcp/7070",
            "::/0 tcp/443",
            "fd00::2:2/128 tcp/443,tcp/8080",
        ]
    );
}

#[test]
fn a_named_port_never_matches_an_ip_block() {
    let block = json!([{"ipBlock": {"cidr": "10.0.0.0/8"}}]);
    let plan = egress(block.clone(), json!([{"port": "web"}]));
    assert_eq!(of(&plan, "x/me").egress, Allowed::Only(Table::default()));
    let plan = egress(block, json!([{"port": "web"}, {"port": 80}]));
    assert_eq!(entries(&of(&plan, "x/me").egress), ["10.0.0.0/8 tcp/80"]);
}

#[test]
fn an_ingress_named_port_is_the_selected_pods_own() {
    let (pods, namespaces) = cluster();
    let into = |port: &str, protocol: &str| {
        let spec = json!({"podSelector": {}, "ingress": [{"ports": [{"port": port, "protocol": protocol}]}]});
        plan(NODE, &[policy("x", "in", spec)], &pods, &namespaces)
    };
    assert_eq!(
        entries(&of(&into("web", "TCP"), "x/me").ingress),
        ["0.0.0.0/0 tcp/8443", "::/0 tcp/8443"]
    );
    // No such port, or not for that protocol: the rule allows nothing.
    assert_eq!(
        of(&into("web", "UDP"), "x/me").ingress,
        Allowed::Only(Table::default())
    );
    assert_eq!(
        of(&into("nope", "TCP"), "x/me").ingress,
        Allowed::Only(Table::default())
    );
}

#[test]
fn protocols_default_to_tcp_and_a_port_less_entry_means_all_its_ports() {
    let plan = egress(
        json!([{"ipBlock": {"cidr": "192.0.2.0/24"}}]),
        json!([{"port": 80}, {"protocol": "SCTP"}, {"protocol": "UDP", "port": 1000, "endPort": 1999}]),
    );
    let egress = &of(&plan, "x/me").egress;
    assert_eq!(
        entries(egress),
        ["192.0.2.0/24 tcp/80,udp/1000-1999,sctp/0-65535"]
    );
    assert!(egress.allows(ip("192.0.2.9"), 132, 0));
    assert!(!egress.allows(ip("192.0.2.9"), 6, 81));
    assert!(
        !egress.allows(ip("192.0.2.9"), 1, 0),
        "ICMP needs a rule without ports"
    );
}

#[test]
fn ports_the_api_would_reject_allow_nothing() {
    for bad in [
        json!([{"port": 90, "endPort": 80}]),
        json!([{"port": 0}]),
        json!([{"port": 70000}]),
        json!([{"port": 80, "protocol": "ICMP"}]),
    ] {
        let plan = egress(json!(null), bad.clone());
        assert_eq!(
            of(&plan, "x/me").egress,
            Allowed::Only(Table::default()),
            "{bad}"
        );
    }
}

#[test]
fn too_many_port_ranges_are_an_error_naming_pod_and_policies() {
    let ports = |from: i32| -> Vec<serde_json::Value> {
        (0..9).map(|i| json!({"port": from + 10 * i})).collect()
    };
    let spec =
        |from: i32, selector| json!({"podSelector": selector, "ingress": [{"ports": ports(from)}]});
    let (mut pods, namespaces) = cluster();
    pods.push(pod("x", "other", &["10.0.1.2"]).build());
    let policies = [
        policy("x", "one", spec(1000, json!({}))),
        policy(
            "x",
            "two",
            spec(2000, json!({"matchLabels": {"pod": "me"}})),
        ),
    ];
    let result = plan(NODE, &policies, &pods, &namespaces);
    let err = result.pods[&key("x/me")].clone().unwrap_err();
    assert_eq!(
        err,
        PolicyError::TooManyPortRanges {
            pod: key("x/me"),
            direction: Direction::Ingress,
            peer: "0.0.0.0/0".into(),
            ranges: 18,
            policies: vec!["one".into(), "two".into()],
        }
    );
    assert!(err.to_string().contains("pod x/me: ingress"), "{err}");
    assert!(err.to_string().contains("policies: one, two"), "{err}");
    // Other pods are not affected: x/other has policy one's 9 ranges.
    assert_eq!(of(&result, "x/other").policies, ["one"]);
    // Twenty ranges that touch merge into one.
    let merged = json!({"podSelector": {}, "ingress": [{"ports": (0..20).map(|i| json!({"port": 1000 + 10 * i, "endPort": 1009 + 10 * i})).collect::<Vec<_>>()}]});
    let result = plan(NODE, &[policy("x", "wide", merged)], &pods, &namespaces);
    assert_eq!(
        entries(&of(&result, "x/me").ingress),
        ["0.0.0.0/0 tcp/1000-1199", "::/0 tcp/1000-1199"]
    );
}

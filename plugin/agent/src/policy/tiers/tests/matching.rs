//! What a rule matches: ports, networks, nodes, and what it cannot read.

use std::net::{IpAddr, Ipv4Addr};

use super::*;

#[test]
fn ports_by_number_range_and_name_and_every_protocol_without_them() {
    let deny = |protocols: serde_json::Value| {
        cnp(
            "ports",
            "Admin",
            1,
            namespace("y"),
            "ingress",
            serde_json::json!([{"action": "Deny", "from": [namespace("x")], "protocols": protocols}]),
        )
    };
    let x_to_y = expect(|f, t| is(f, "x") && is(t, "y"));
    let nothing = expect(|_, _| false);
    for (protocols, tcp, udp, icmp) in [
        (
            serde_json::json!([{"tcp": {"destinationPort": {"number": 80}}}]),
            &x_to_y,
            &nothing,
            &nothing,
        ),
        (
            serde_json::json!([{"tcp": {"destinationPort": {"range": {"start": 79, "end": 80}}}}]),
            &x_to_y,
            &nothing,
            &nothing,
        ),
        (
            serde_json::json!([{"tcp": {"destinationPort": {"range": {"start": 81, "end": 90}}}}]),
            &nothing,
            &nothing,
            &nothing,
        ),
        (
            serde_json::json!([{"udp": {"destinationPort": {"number": 81}}}]),
            &nothing,
            &x_to_y,
            &nothing,
        ),
        (
            serde_json::json!([{"destinationNamedPort": "serve-80-tcp"}]),
            &x_to_y,
            &nothing,
            &nothing,
        ),
        (
            serde_json::json!([{"destinationNamedPort": "serve-81-udp"}]),
            &nothing,
            &x_to_y,
            &nothing,
        ),
        (
            serde_json::json!([{"destinationNamedPort": "no-such-port"}]),
            &nothing,
            &nothing,
            &nothing,
        ),
    ] {
        let policies = [deny(protocols.clone())];
        for (traffic, want) in [(TCP, tcp), (UDP, udp), (ICMP, icmp)] {
            let got = table(&policies, &no_network_policy, traffic);
            assert_tables(&got, want);
        }
    }
    // No protocols: every protocol, ICMP included.
    let all = cnp(
        "all",
        "Admin",
        1,
        namespace("y"),
        "ingress",
        serde_json::json!([{"action": "Deny", "from": [namespace("x")]}]),
    );
    for traffic in [TCP, UDP, ICMP] {
        let got = table(std::slice::from_ref(&all), &no_network_policy, traffic);
        assert_tables(&got, &x_to_y);
    }
}

#[test]
fn networks_match_pod_addresses_and_nodes_match_node_addresses() {
    // y's pods are 10.0.1.0/24.
    let networks = cnp(
        "networks",
        "Admin",
        1,
        namespace("x"),
        "egress",
        serde_json::json!([{"action": "Deny", "to": [{"networks": ["10.0.1.0/24", "fd00::/8"]}]}]),
    );
    let got = table(&[networks], &no_network_policy, TCP);
    assert_tables(&got, &expect(|f, t| is(f, "x") && is(t, "y")));

    let universe = Universe::new();
    let node_labels = labels("role", "control-plane");
    let node = Remote {
        address: IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1)),
        pod: None,
        node_labels: Some(&node_labels),
    };
    let to_nodes = |selector: serde_json::Value| {
        cnp(
            "nodes",
            "Admin",
            1,
            namespace("x"),
            "egress",
            serde_json::json!([{"action": "Deny", "to": [{"nodes": selector}]}]),
        )
    };
    let x_a = universe.workload(PodId(0, 0));
    let judged = |policies: &[ClusterNetworkPolicy], remote: &Remote<'_>| {
        judge(policies, Direction::Egress, &x_a, remote, TCP, None).accepted
    };
    assert!(!judged(&[to_nodes(serde_json::json!({}))], &node));
    let other_role = serde_json::json!({"matchLabels": {"role": "worker"}});
    assert!(judged(&[to_nodes(other_role)], &node));
    // A pod is no node, and a node no pod.
    assert!(judged(
        &[to_nodes(serde_json::json!({}))],
        &universe.remote(PodId(1, 0))
    ));
    let pods = cnp(
        "pods",
        "Admin",
        1,
        namespace("x"),
        "egress",
        serde_json::json!([{"action": "Deny", "to": [{"namespaces": {}}]}]),
    );
    assert!(judged(&[pods], &node));
}

#[test]
fn what_is_not_understood_fails_closed() {
    let rule = |action: &str, peer: serde_json::Value| {
        let rules = serde_json::json!([{"action": action, "from": [peer]}]);
        cnp("unsupported", "Admin", 1, namespace("y"), "ingress", rules)
    };
    let domain = serde_json::json!({"domainNames": ["example.com"]});
    let unknown = serde_json::json!({"services": {"name": "s"}});
    let into_y = expect(|_, t| is(t, "y"));
    // Accept matches nothing: the connections fall to the default here.
    let got = table(&[rule("Accept", domain.clone())], &no_network_policy, TCP);
    assert_tables(&got, &expect(|_, _| false));
    // Deny and Pass deny everything of that direction.
    for action in ["Deny", "Pass"] {
        for peer in [&domain, &unknown] {
            let got = table(&[rule(action, peer.clone())], &no_network_policy, TCP);
            assert_tables(&got, &into_y);
        }
    }
    // A subject not understood selects nothing.
    let odd = cnp(
        "odd-subject",
        "Admin",
        1,
        serde_json::json!({}),
        "ingress",
        serde_json::json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
    );
    assert_tables(
        &table(&[odd], &no_network_policy, TCP),
        &expect(|_, _| false),
    );
}

#[test]
fn decisions_say_who_made_them() {
    let universe = Universe::new();
    let deny = cnp(
        "deny-x",
        "Baseline",
        3,
        namespace("y"),
        "ingress",
        serde_json::json!([{"action": "Accept", "from": [namespace("z")]}, {"action": "Deny", "from": [namespace("x")]}]),
    );
    let decision = judge(
        &[deny],
        Direction::Ingress,
        &universe.workload(PodId(1, 0)),
        &universe.remote(PodId(0, 1)),
        TCP,
        None,
    );
    assert_eq!(
        decision.to_string(),
        "denied by Baseline policy deny-x, rule 1"
    );
    let decision = judge(
        &[],
        Direction::Ingress,
        &universe.workload(PodId(1, 0)),
        &universe.remote(PodId(0, 1)),
        TCP,
        Some(false),
    );
    assert_eq!(decision.to_string(), "denied by NetworkPolicy");
}

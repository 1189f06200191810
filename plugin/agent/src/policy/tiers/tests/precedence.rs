//! Tiers, NetworkPolicy between them, priorities and rule order.

use super::*;

#[test]
fn without_policies_everything_reaches_everything() {
    assert_tables(&table(&[], &no_network_policy, TCP), &expect(|_, _| false));
}

#[test]
fn an_admin_deny_wins_over_a_network_policy_allow() {
    let deny = cnp(
        "deny-x-to-y",
        "Admin",
        10,
        namespace("y"),
        "ingress",
        serde_json::json!([{"action": "Deny", "from": [namespace("x")]}]),
    );
    // A NetworkPolicy in y that allows everything in.
    let allow_all_into_y = |s: PodId, d, _| (is(s, "y") && d == Direction::Ingress).then_some(true);
    let got = table(&[deny], &allow_all_into_y, TCP);
    assert_tables(&got, &expect(|f, t| is(f, "x") && is(t, "y")));
}

#[test]
fn an_admin_pass_leaves_the_connection_to_network_policy() {
    let policies = [
        cnp(
            "pass-x",
            "Admin",
            10,
            namespace("y"),
            "ingress",
            serde_json::json!([{"action": "Pass", "from": [namespace("x")]}]),
        ),
        cnp(
            "deny-all-into-y",
            "Admin",
            20,
            namespace("y"),
            "ingress",
            serde_json::json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
        ),
    ];
    // y's NetworkPolicy admits x/a only.
    let only_x_a = |s: PodId, d, other: PodId| {
        (is(s, "y") && d == Direction::Ingress).then_some(other == PodId(0, 0))
    };
    let got = table(&policies, &only_x_a, TCP);
    assert_tables(&got, &expect(|f, t| is(t, "y") && f != PodId(0, 0)));
}

#[test]
fn a_baseline_deny_is_a_default_a_namespace_opens_with_network_policy() {
    let default_deny = cnp(
        "default-deny",
        "Baseline",
        0,
        serde_json::json!({"namespaces": {}}),
        "ingress",
        serde_json::json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
    );
    // z's NetworkPolicy admits y.
    let z_admits_y = |s: PodId, d, other: PodId| {
        (is(s, "z") && d == Direction::Ingress).then_some(is(other, "y"))
    };
    let got = table(&[default_deny], &z_admits_y, TCP);
    assert_tables(&got, &expect(|f, t| !(is(t, "z") && is(f, "y"))));
}

#[test]
fn the_baseline_applies_only_where_no_network_policy_isolates_that_direction() {
    let deny = cnp(
        "x-not-to-y",
        "Baseline",
        0,
        namespace("x"),
        "egress",
        serde_json::json!([{"action": "Deny", "to": [namespace("y")]}]),
    );
    // x/a's egress is isolated by a NetworkPolicy that allows all; its
    // ingress is not, so the baseline's egress rule is not about it.
    let x_a_egress = |s: PodId, d, _| (s == PodId(0, 0) && d == Direction::Egress).then_some(true);
    let got = table(&[deny], &x_a_egress, TCP);
    assert_tables(
        &got,
        &expect(|f, t| is(f, "x") && f != PodId(0, 0) && is(t, "y")),
    );
}

#[test]
fn priorities_then_names_then_rule_order_decide() {
    let accept_x_a = |priority| {
        cnp(
            "accept-x-a",
            "Admin",
            priority,
            namespace("y"),
            "ingress",
            serde_json::json!([{"action": "Accept", "from": [pod("x", "a")]}]),
        )
    };
    let deny_x = |name: &str, priority| {
        cnp(
            name,
            "Admin",
            priority,
            namespace("y"),
            "ingress",
            serde_json::json!([{"action": "Deny", "from": [namespace("x")]}]),
        )
    };
    let only_x_a_passes = expect(|f, t| is(t, "y") && is(f, "x") && f != PodId(0, 0));
    let all_x_denied = expect(|f, t| is(t, "y") && is(f, "x"));
    let got = table(
        &[deny_x("deny-x", 10), accept_x_a(5)],
        &no_network_policy,
        TCP,
    );
    assert_tables(&got, &only_x_a_passes);
    let got = table(
        &[deny_x("deny-x", 5), accept_x_a(10)],
        &no_network_policy,
        TCP,
    );
    assert_tables(&got, &all_x_denied);
    // Equal priorities: by name ("accept-x-a" before "deny-x").
    let got = table(
        &[deny_x("deny-x", 5), accept_x_a(5)],
        &no_network_policy,
        TCP,
    );
    assert_tables(&got, &only_x_a_passes);
    // Within a policy, the rules as written.
    let ordered = |first: serde_json::Value, second: serde_json::Value| {
        cnp(
            "ordered",
            "Admin",
            1,
            namespace("y"),
            "ingress",
            serde_json::json!([first, second]),
        )
    };
    let accept = serde_json::json!({"action": "Accept", "from": [pod("x", "a")]});
    let deny = serde_json::json!({"action": "Deny", "from": [namespace("x")]});
    let got = table(
        &[ordered(accept.clone(), deny.clone())],
        &no_network_policy,
        TCP,
    );
    assert_tables(&got, &only_x_a_passes);
    let got = table(&[ordered(deny, accept)], &no_network_policy, TCP);
    assert_tables(&got, &all_x_denied);
}

//! A node's settings reach the traffic: dual-stack pods talk over IPv6
//! through the fast path, XDP mode's pods talk through the stack both ways,
//! and an explicit uplink and MTU reach the conflist, the pods and the
//! traffic.

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::*;

use super::fixture::uplink_program_attached;

#[flatnet_test(root)]
fn dual_stack_pods_on_two_nodes_talk_over_ipv6_through_the_fast_path() {
    let cluster = Cluster::started(&Cluster::numbered(2, true), &[]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let list = n1.conflist();
    assert_eq!(
        list["plugins"][0]["ipam"]["ranges"][1][0]["subnet"],
        "fd44:0:0:1::/64"
    );
    let routes6 = n1
        .netns
        .exec(&["ip", "-6", "route", "show", "proto", ROUTE_PROTO]);
    assert!(routes6.contains("fd44:0:0:2::/64 via fd30::2"), "{routes6}");
    assert!(
        n1.remote_cidrs()
            .contains(&"fd44:0:0:2::/64 via fd30::2".to_string()),
        "{:?}",
        n1.remote_cidrs()
    );
    let a = n1.pod();
    let b = n2.pod();
    let (a6, b6) = (
        a.ip6.expect("an IPv6 address"),
        b.ip6.expect("an IPv6 address"),
    );
    assert!(a6.to_string().starts_with("fd44:0:0:1::"), "{a6}");
    let before = (
        n1.bytes(action::TO_REMOTE_NODE),
        n2.bytes(action::FROM_UPLINK),
        n2.bytes(action::TO_REMOTE_NODE),
        n1.bytes(action::FROM_UPLINK),
    );
    tcp_echo(Some(&b.netns), b6, Some(&a.netns), 1 << 20).expect("n1 -> n2 over IPv6");
    tcp_echo(Some(&a.netns), a6, Some(&b.netns), 1 << 20).expect("n2 -> n1 over IPv6");
    let sent1 = n1.bytes(action::TO_REMOTE_NODE) - before.0;
    let received2 = n2.bytes(action::FROM_UPLINK) - before.1;
    let sent2 = n2.bytes(action::TO_REMOTE_NODE) - before.2;
    let received1 = n1.bytes(action::FROM_UPLINK) - before.3;
    eprintln!(
        "IPv6: n1 sent {sent1}, n2 delivered {received2}; n2 sent {sent2}, n1 delivered {received1}"
    );
    for (what, count) in [
        ("n1 fast path out", sent1),
        ("n2 uplink to pod", received2),
        ("n2 fast path out", sent2),
        ("n1 uplink to pod", received1),
    ] {
        // 2 MiB of payload each way (1 MiB sent, 1 MiB echoed), headers on
        // top; 2% may have taken the stack.
        assert!(count > (2 << 20) * 49 / 50, "{what}: {count} bytes");
    }
    // IPv4 still works beside it.
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1000).expect("n1 -> n2 over IPv4");
}

#[flatnet_test(root)]
fn xdp_mode_pods_on_two_nodes_talk_through_the_stack_both_ways() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--datapath", "xdp"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    assert_eq!(n1.conflist()["plugins"][0]["datapath"], "xdp");
    assert!(
        uplink_program_attached(n1),
        "from_uplink not on n1's uplink"
    );
    let a = n1.pod();
    let b = n2.pod();
    let (passed, forwarded, forwarded2) = (
        n1.bytes(action::REMOTE_PASSED),
        n1.forwarded(),
        n2.forwarded(),
    );
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), 1 << 20).expect("n2 -> n1");
    // XDP has no redirect-to-neighbour: the sender's stack routes them...
    assert!(n1.bytes(action::REMOTE_PASSED) - passed > (2 << 20) * 49 / 50);
    // (The node's stack counts segments: GSO packets are cut for the uplink.)
    assert!(n1.forwarded() - forwarded > 50);
    assert_eq!(n1.packets(action::TO_REMOTE_NODE), 0);
    // ...and so does the receiver's, so that each node's conntrack sees
    // both directions of every flow: the uplink program hands nothing to
    // pods in XDP mode.
    assert!(n2.forwarded() - forwarded2 > 50);
    assert_eq!(n2.packets(action::FROM_UPLINK), 0);
    assert_eq!(n1.packets(action::FROM_UPLINK), 0);
}

#[flatnet_test(root)]
fn an_explicit_uplink_and_mtu_reach_the_conflist_the_pods_and_the_traffic() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--uplink", "up0", "--mtu", "1400"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    assert_eq!(n1.conflist()["plugins"][0]["mtu"], 1400);
    assert!(uplink_program_attached(n1));
    let a = n1.pod();
    let b = n2.pod();
    let mtu = a.netns.exec(&["cat", "/sys/class/net/eth0/mtu"]);
    assert_eq!(mtu.trim(), "1400");
    let (sent, passed) = (
        n1.bytes(action::TO_REMOTE_NODE),
        n1.bytes(action::REMOTE_PASSED),
    );
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2");
    let sent = n1.bytes(action::TO_REMOTE_NODE) - sent;
    let passed = n1.bytes(action::REMOTE_PASSED) - passed;
    assert!(
        sent > 1 << 20 && passed < sent / 50,
        "fast path {sent} B, passed to the stack {passed} B"
    );
}

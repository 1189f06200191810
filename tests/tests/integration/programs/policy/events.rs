//! NetworkPolicy drop events (`POLICY_EVENTS`): each drop is reported
//! once, and events that do not fit are counted as lost.

use std::net::IpAddr;

use flatnet::config::DatapathMode;
use flatnet_common::{
    POLICY_DIR_EGRESS, POLICY_DIR_INGRESS, POLICY_EVENTS_BYTES, POLICY_REASON_EXCEPT,
    POLICY_REASON_NO_PREFIX, POLICY_REASON_PORT, PROG_FROM_POD, PolicyEvent, action,
};
use flatnet_tests::flatnet_test;
use flatnet_tests::frames::*;
use flatnet_tests::test_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, run_tc};

use super::fixture::{any_from, rule, tcp_port};
use crate::programs::{FAMILIES, Family, Hook, Node, OUTSIDE, Tuple, UNUSED};

/// The events waiting in the node's `POLICY_EVENTS`.
fn policy_events(node: &Node) -> Vec<PolicyEvent> {
    node.scratch
        .datapath
        .policy_events()
        .expect("opening POLICY_EVENTS")
        .drain()
}

/// An address as events carry it (IPv4 in the first 4 bytes).
fn event_address(ip: IpAddr) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes = v6.octets(),
    }
    bytes
}

#[flatnet_test(root)]
fn policy_drops_are_reported_once_each_in_the_event_ring() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // A: egress to the pod subnet on TCP 8080, except the unused address.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(8080)]),
        rule("10.244.1.99/32", &[]),
        rule("fd00:244::/32", &[tcp_port(8080)]),
        rule("fd00:244:1::99/128", &[]),
    ];
    node.set_policy(a, None, Some(&egress));
    // B: ingress only from the unused address.
    let ingress = [
        any_from(&format!("{}/32", UNUSED.v4)),
        any_from(&format!("{}/128", UNUSED.v6)),
    ];
    node.set_policy(b, Some(&ingress), None);
    assert!(policy_events(&node).is_empty(), "events before any drop");
    let allowed_by_a_denied_by_b = 8080;
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let cases = [
            (
                "TCP 9090 to B",
                Tuple::new(ai, 40002, bi, 9090),
                a,
                POLICY_DIR_EGRESS,
                bi,
                POLICY_REASON_PORT,
            ),
            (
                "TCP 8080 to the except",
                Tuple::new(ai, 40003, UNUSED.of(family), 8080),
                a,
                POLICY_DIR_EGRESS,
                UNUSED.of(family),
                POLICY_REASON_EXCEPT,
            ),
            (
                "TCP 8080 outside every prefix",
                Tuple::new(ai, 40004, OUTSIDE.of(family), 8080),
                a,
                POLICY_DIR_EGRESS,
                OUTSIDE.of(family),
                POLICY_REASON_NO_PREFIX,
            ),
            (
                "TCP 8080 to B, not in B's ingress",
                Tuple::new(ai, 40005, bi, allowed_by_a_denied_by_b),
                b,
                POLICY_DIR_INGRESS,
                ai,
                POLICY_REASON_NO_PREFIX,
            ),
        ];
        for (case, flow, owner, direction, peer, reason) in cases {
            let frame = a.sends(flow.tcp(TCP_SYN));
            let outcome = node.try_run(Hook::PodTc(a), &frame).expect(case);
            assert_eq!(outcome.verdict, TC_ACT_SHOT, "{family:?} {case}: verdict");
            let events = policy_events(&node);
            assert_eq!(events.len(), 1, "{family:?} {case}: {events:?}");
            let event = events[0];
            assert_eq!(event.slot, owner.slot, "{family:?} {case}: slot");
            assert_eq!(
                u32::from(event.direction),
                direction,
                "{family:?} {case}: direction"
            );
            assert_eq!(event.reason, reason, "{family:?} {case}: reason");
            assert_eq!(event.protocol, IPPROTO_TCP, "{family:?} {case}");
            assert_eq!(
                event.family,
                if family == Family::V4 { 4 } else { 6 },
                "{family:?} {case}"
            );
            assert_eq!(event.src, event_address(flow.src), "{family:?} {case}: src");
            assert_eq!(event.dst, event_address(flow.dst), "{family:?} {case}: dst");
            let seen_peer = if direction == POLICY_DIR_INGRESS {
                event.src
            } else {
                event.dst
            };
            assert_eq!(seen_peer, event_address(peer), "{family:?} {case}: peer");
            assert_eq!(
                u16::from_be_bytes(event.sport),
                flow.sport,
                "{family:?} {case}"
            );
            assert_eq!(
                u16::from_be_bytes(event.dport),
                flow.dport,
                "{family:?} {case}"
            );
            assert_eq!(event.len as usize, frame.len(), "{family:?} {case}: len");
            assert!(event.timestamp_ns > 0, "{family:?} {case}: timestamp");
        }
        // Allowed both ways (A's egress to the except's neighbour on 8080
        // is not B's business): no event. A to B on 8080 with B open.
        node.scratch.datapath.clear_pod_policy(b.slot).unwrap();
        let frame = a.sends(Tuple::new(ai, 40006, bi, 8080).tcp(TCP_SYN));
        let outcome = node.try_run(Hook::PodTc(a), &frame).unwrap();
        assert_eq!(outcome.verdict, TC_ACT_REDIRECT, "{family:?} allowed");
        assert!(
            policy_events(&node).is_empty(),
            "{family:?}: an allowed packet made an event"
        );
        node.set_policy(b, Some(&ingress), None);
    }
    assert_eq!(node.stats()[action::POLICY_EVENTS_LOST as usize].packets, 0);
}

#[flatnet_test(root)]
fn policy_events_that_do_not_fit_are_counted_as_lost() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    node.set_policy(a, None, Some(&[]));
    let frame = a.sends(Tuple::new(a.ip(Family::V4), 40000, OUTSIDE.v4.into(), 80).tcp(TCP_SYN));
    // 64 bytes a record: the ring holds 4096 of them; nobody reads.
    let capacity = (POLICY_EVENTS_BYTES / 64) as u64;
    let runs = capacity + 100;
    let path = node.scratch.program_path(PROG_FROM_POD);
    node.netns.run(|| {
        for _ in 0..runs {
            let outcome = run_tc(&path, &frame, a.host_ifindex).expect("test run");
            assert_eq!(outcome.verdict, TC_ACT_SHOT);
        }
    });
    let stats = node.stats();
    assert_eq!(stats[action::POLICY_DENIED as usize].packets, runs);
    // The kernel keeps a little room free (4095 records fit here).
    let lost = stats[action::POLICY_EVENTS_LOST as usize].packets;
    let kept = policy_events(&node).len() as u64;
    assert_eq!(kept + lost, runs, "{kept} events kept, {lost} lost");
    assert!(
        (capacity - 8..=capacity).contains(&kept),
        "{kept} events kept"
    );
    // Read out, the ring takes events again.
    node.check(
        "a drop after the ring was read",
        Hook::PodTc(a),
        &frame,
        TC_ACT_SHOT,
        &frame,
        &[("policy_denied", 1)],
    );
    assert_eq!(policy_events(&node).len(), 1);
}

//! Flows the programs recorded under a policy: their replies and ICMP
//! errors pass as part of them until the policy changes, and a flow
//! between two selected pods follows either pod's change.

use flatnet::config::DatapathMode;
use flatnet_tests::flatnet_test;
use flatnet_tests::frames::*;
use flatnet_tests::test_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_NEXT};

use super::fixture::{rule, tcp_port, udp_port};
use crate::programs::{FAMILIES, Hook, Node, TTL, Tuple};

#[flatnet_test(root)]
fn policy_replies_of_a_recorded_flow_pass_until_the_policy_changes() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // A may open TCP 8080 to B and takes nothing in.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(8080)]),
        rule("fd00:244::/32", &[tcp_port(8080)]),
    ];
    node.set_policy(a, Some(&[]), Some(&egress));
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        let syn = a.sends(flow.tcp(TCP_SYN));
        node.check(
            &format!("{family:?} A opens 8080 on B"),
            Hook::PodTc(a),
            &syn,
            TC_ACT_REDIRECT,
            &b.receives(&syn),
            &[("redirected", 1)],
        );
        // B's answer has no entry in A's (empty) ingress table: it passes
        // as the reply of the flow A's egress recorded.
        let answer = b.sends(flow.reversed().tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} B answers"),
            Hook::PodTc(b),
            &answer,
            TC_ACT_REDIRECT,
            &a.receives(&answer),
            &[("redirected", 1)],
        );
        // The same through the stack (to_pod), e.g. after a ClusterIP.
        node.check(
            &format!("{family:?} B's answer through the stack"),
            Hook::ToPod(a),
            &answer,
            TC_NEXT,
            &answer,
            &[],
        );
        // A connection B opens to A is no reply.
        let other = b.sends(Tuple::new(b.ip(family), 40000, a.ip(family), 8080).tcp(TCP_SYN));
        node.check(
            &format!("{family:?} B opens 8080 on A"),
            Hook::PodTc(b),
            &other,
            TC_ACT_SHOT,
            &a.receives(&other),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (2, 0));
    // A new policy that no longer allows 8080: the recorded flow is judged
    // again at its next packet, both ways, and cut.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(9090)]),
        rule("fd00:244::/32", &[tcp_port(9090)]),
    ];
    let before = node.scratch.datapath.pod_policy(a.slot).unwrap().generation;
    node.set_policy(a, Some(&[]), Some(&egress));
    assert_eq!(
        node.scratch.datapath.pod_policy(a.slot).unwrap().generation,
        before + 1
    );
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        let ack = a.sends(flow.tcp(TCP_ACK));
        node.check(
            &format!("{family:?} A's next packet after the change"),
            Hook::PodTc(a),
            &ack,
            TC_ACT_SHOT,
            &b.receives(&ack),
            &[("policy_denied", 1)],
        );
        let answer = b.sends(flow.reversed().tcp(TCP_ACK));
        node.check(
            &format!("{family:?} B's next answer after the change"),
            Hook::PodTc(b),
            &answer,
            TC_ACT_SHOT,
            &a.receives(&answer),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (4, 2));
}

#[flatnet_test(root)]
fn policy_between_two_selected_pods_follows_either_pods_change() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let both_families = |port: u16| {
        [
            rule("10.244.0.0/16", &[tcp_port(port)]),
            rule("fd00:244::/32", &[tcp_port(port)]),
        ]
    };
    // A may open 8080 anywhere in the cluster, B takes 8080 in: both
    // judged on the redirect, then answered by one pair record.
    node.set_policy(a, None, Some(&both_families(8080)));
    node.set_policy(b, Some(&both_families(8080)), None);
    let segment =
        |family, flags| a.sends(Tuple::new(a.ip(family), 40050, b.ip(family), 8080).tcp(flags));
    for family in FAMILIES {
        for (case, flags) in [("SYN", TCP_SYN), ("ACK", TCP_ACK), ("next ACK", TCP_ACK)] {
            let frame = segment(family, flags);
            node.check(
                &format!("{family:?} A's {case} to B"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_REDIRECT,
                &b.receives(&frame),
                &[("redirected", 1)],
            );
        }
    }
    // B's policy changes (no longer 8080): A's next packet is judged again
    // by B's new table and dropped, counted as B's ingress drop.
    node.set_policy(b, Some(&both_families(9090)), None);
    for family in FAMILIES {
        let frame = segment(family, TCP_ACK);
        node.check(
            &format!("{family:?} A's ACK after B's change"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &b.receives(&frame),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(b), (2, 0));
    // Back to 8080 for B, then A's policy changes: A's egress cuts it.
    node.set_policy(b, Some(&both_families(8080)), None);
    for family in FAMILIES {
        let frame = segment(family, TCP_ACK);
        node.check(
            &format!("{family:?} A's ACK with B allowing again"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
    }
    node.set_policy(a, None, Some(&both_families(9090)));
    for family in FAMILIES {
        let frame = segment(family, TCP_ACK);
        node.check(
            &format!("{family:?} A's ACK after A's change"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &b.receives(&frame),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (0, 2));
}

#[flatnet_test(root)]
fn policy_icmp_errors_of_a_recorded_flow_pass_as_part_of_it() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // A may send UDP 8080 to B and takes nothing in.
    let egress = [
        rule("10.244.0.0/16", &[udp_port(8080)]),
        rule("fd00:244::/32", &[udp_port(8080)]),
    ];
    node.set_policy(a, Some(&[]), Some(&egress));
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40040, b.ip(family), 8080);
        let (_, datagram) = flow.udp();
        let sent = a.sends(flow.udp());
        node.check(
            &format!("{family:?} A sends UDP 8080 to B"),
            Hook::PodTc(a),
            &sent,
            TC_ACT_REDIRECT,
            &b.receives(&sent),
            &[("redirected", 1)],
        );
        // B's port unreachable quotes A's datagram: part of A's flow, it
        // gets in though A's ingress table is empty; on the redirect and
        // through the stack alike.
        let about = |quoted: &[u8]| {
            let (proto, message) = port_unreachable(b.ip(family), a.ip(family), quoted);
            b.sends(ip(b.ip(family), a.ip(family), TTL, proto, &message))
        };
        let error = about(&datagram);
        node.check(
            &format!("{family:?} B's port unreachable"),
            Hook::PodTc(b),
            &error,
            TC_ACT_REDIRECT,
            &a.receives(&error),
            &[("redirected", 1)],
        );
        node.check(
            &format!("{family:?} B's port unreachable through the stack"),
            Hook::ToPod(a),
            &error,
            TC_NEXT,
            &error,
            &[],
        );
        // One quoting a datagram A never sent (another source port) is
        // ICMP like any other: denied.
        let (_, other) = Tuple::new(a.ip(family), 40041, b.ip(family), 8080).udp();
        let error = about(&other);
        node.check(
            &format!("{family:?} an error of no recorded flow"),
            Hook::PodTc(b),
            &error,
            TC_ACT_SHOT,
            &a.receives(&error),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (2, 0));
}

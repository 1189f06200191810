//! A pod's policy tables judge its traffic: pods no policy selects are
//! left alone, egress allows only the tables' ports and prefixes, a local
//! destination's ingress is judged before the redirect, link-scope traffic
//! is never judged, and `to_pod` judges what the stack delivers and trusts
//! the node.

use std::net::Ipv6Addr;

use flatnet::config::DatapathMode;
use flatnet_common::{POLICY_F_EGRESS, POLICY_F_INGRESS};
use flatnet_tests::flatnet_test;
use flatnet_tests::frames::*;
use flatnet_tests::test_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_NEXT};

use super::fixture::{any_from, ip_echo, rule, tcp_port, udp_port};
use crate::programs::cross_node::from_remote;
use crate::programs::{
    FAMILIES, Family, HOST_B_MAC, Hook, Node, OUTSIDE, POD_A, POD_B, POD_B_MAC, REMOTE_POD,
    THIS_NODE, TTL, Tuple, UNUSED,
};

#[flatnet_test(root)]
fn policy_leaves_pods_no_policy_selects_alone() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    assert_eq!(
        node.scratch.datapath.slot_of(a.ip(Family::V4)).unwrap(),
        Some(a.slot)
    );
    assert_eq!(node.scratch.datapath.pod_policy(a.slot).unwrap().flags, 0);
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 9999);
        let frame = a.sends(flow.udp());
        node.pod_to_pod(
            &format!("{family:?} unselected A to unselected B"),
            (a, b),
            &frame,
            true,
        );
        let from_host = b.sends(Tuple::new(THIS_NODE.of(family), 1, b.ip(family), 2).udp());
        node.check(
            &format!("{family:?} host to unselected B"),
            Hook::ToPod(b),
            &from_host,
            TC_NEXT,
            &from_host,
            &[],
        );
    }
    assert_eq!(node.policy_drops(a), (0, 0));
}

#[flatnet_test(root)]
fn policy_egress_allows_only_the_tables_ports_and_prefixes() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // The pod subnet on TCP 8080 and UDP 53, except the unused address;
    // nothing else.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(8080), udp_port(53)]),
        rule("10.244.1.99/32", &[]),
        rule("fd00:244::/32", &[tcp_port(8080), udp_port(53)]),
        rule("fd00:244:1::99/128", &[]),
    ];
    node.set_policy(a, None, Some(&egress));
    assert_eq!(
        node.scratch.datapath.pod_policy(a.slot).unwrap().flags,
        POLICY_F_EGRESS
    );
    let mut denied = 0;
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let allowed = [
            ("TCP 8080", Tuple::new(ai, 40000, bi, 8080).tcp(TCP_SYN)),
            ("UDP 53", Tuple::new(ai, 40001, bi, 53).udp()),
        ];
        for (case, packet) in allowed {
            let frame = a.sends(packet);
            node.pod_to_pod(&format!("{family:?} {case} to B"), (a, b), &frame, true);
        }
        let dropped = [
            (
                "TCP 9090 to B",
                Tuple::new(ai, 40002, bi, 9090).tcp(TCP_SYN),
            ),
            ("UDP 8080 to B", Tuple::new(ai, 40003, bi, 8080).udp()),
            ("TCP 53 to B", Tuple::new(ai, 40004, bi, 53).tcp(TCP_SYN)),
            (
                "TCP 8080 to the except",
                Tuple::new(ai, 40005, UNUSED.of(family), 8080).tcp(TCP_SYN),
            ),
            (
                "TCP 8080 outside every prefix",
                Tuple::new(ai, 40006, OUTSIDE.of(family), 8080).tcp(TCP_SYN),
            ),
            (
                "TCP 8080 to the node",
                Tuple::new(ai, 40007, THIS_NODE.of(family), 8080).tcp(TCP_SYN),
            ),
            ("ICMP echo to B", ip_echo(ai, bi)),
        ];
        for (case, packet) in dropped {
            let frame = a.sends(packet);
            // Judged once the datapath has decided: a frame for B is
            // already rewritten for it.
            let left = if case.ends_with("to B") {
                b.receives(&frame)
            } else {
                frame.clone()
            };
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_SHOT,
                &left,
                &[("policy_denied", 1)],
            );
            denied += 1;
        }
    }
    assert_eq!(
        node.policy_drops(a),
        (0, denied),
        "A's (ingress, egress) drops"
    );
    assert_eq!(node.policy_drops(b), (0, 0), "B's drops");
    // Not isolated any more: everything goes again, no entry is left.
    node.scratch.datapath.clear_pod_policy(a.slot).unwrap();
    assert!(
        node.scratch
            .datapath
            .pod_policy_rules(a.slot)
            .unwrap()
            .is_empty()
    );
    let frame = a.sends(Tuple::new(a.ip(Family::V4), 40002, b.ip(Family::V4), 9090).tcp(TCP_SYN));
    node.check(
        "TCP 9090 to B once the policy is gone",
        Hook::PodTc(a),
        &frame,
        TC_ACT_REDIRECT,
        &b.receives(&frame),
        &[("redirected", 1)],
    );
}

#[flatnet_test(root)]
fn policy_ingress_of_a_local_destination_is_judged_before_the_redirect() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // B takes TCP 8080 from A only.
    let ingress = [
        rule(&format!("{}/32", POD_A.v4), &[tcp_port(8080)]),
        rule(&format!("{}/128", POD_A.v6), &[tcp_port(8080)]),
    ];
    node.set_policy(b, Some(&ingress), None);
    assert_eq!(
        node.scratch.datapath.pod_policy(b.slot).unwrap().flags,
        POLICY_F_INGRESS
    );
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let frame = a.sends(Tuple::new(ai, 40000, bi, 8080).tcp(TCP_SYN));
        node.pod_to_pod(&format!("{family:?} A to B on 8080"), (a, b), &frame, true);
        let frame = a.sends(Tuple::new(ai, 40001, bi, 9090).tcp(TCP_SYN));
        // Rewritten for B before the judgement; dropped all the same.
        node.pod_to_pod(&format!("{family:?} A to B on 9090"), (a, b), &frame, false);
        // From another node's pod, through the uplink: not in B's table.
        let frame = from_remote(REMOTE_POD.of(family), bi, TTL);
        let outcome = node.try_run(Hook::Uplink, &frame).unwrap();
        assert_eq!(outcome.verdict, TC_ACT_SHOT, "{family:?} remote pod to B");
    }
    assert_eq!(node.policy_drops(b), (4, 0), "B's (ingress, egress) drops");
    assert_eq!(node.policy_drops(a), (0, 0), "A's drops");
    let rules = node.scratch.datapath.pod_policy_rules(b.slot).unwrap();
    assert_eq!(rules.len(), 2, "{rules:?}");
}

#[flatnet_test(root)]
fn policy_never_judges_link_scope_traffic() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    // Nothing in, nothing out.
    node.set_policy(a, Some(&[]), Some(&[]));
    let all_mld_routers: Ipv6Addr = "ff02::16".parse().expect("address");
    // An MLDv2 report as a pod's kernel sends it on joining a group: from
    // the unspecified address, behind a Hop-by-Hop header with the router
    // alert option (next header 0, so no transport header follows the
    // fixed one).
    let report = icmpv6(
        Ipv6Addr::UNSPECIFIED,
        all_mld_routers,
        143,
        0,
        &[0, 0, 0, 0],
    );
    let hop_by_hop = [IPPROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
    let frame = a.sends((
        ETH_P_IPV6,
        ipv6(
            Ipv6Addr::UNSPECIFIED,
            all_mld_routers,
            1,
            0,
            &[&hop_by_hop[..], &report].concat(),
        ),
    ));
    node.check(
        "MLDv2 report to ff02::16 behind a Hop-by-Hop header",
        Hook::PodTc(a),
        &frame,
        TC_NEXT,
        &frame,
        &[("passed_to_stack", 1)],
    );
    // UDP between link-local addresses (the pod and its host veth).
    let link_local_a: Ipv6Addr = "fe80::a".parse().expect("address");
    let link_local_host: Ipv6Addr = "fe80::1".parse().expect("address");
    let frame = a.sends(Tuple::new(link_local_a.into(), 546, link_local_host.into(), 547).udp());
    node.check(
        "UDP to a link-local address",
        Hook::PodTc(a),
        &frame,
        TC_NEXT,
        &frame,
        &[("passed_to_stack", 1)],
    );
    assert_eq!(node.policy_drops(a), (0, 0));
}

#[flatnet_test(root)]
fn policy_to_pod_judges_what_the_stack_delivers_and_trusts_the_node() {
    let node = Node::new(DatapathMode::Tc);
    let b = &node.b;
    let datapath = &node.scratch.datapath;
    datapath
        .set_local_addresses(&[THIS_NODE.v4.into(), THIS_NODE.v6.into()])
        .unwrap();
    // B takes anything from the remote pod, and nothing else; sends nothing.
    let ingress = [
        any_from(&format!("{}/32", REMOTE_POD.v4)),
        any_from(&format!("{}/128", REMOTE_POD.v6)),
    ];
    node.set_policy(b, Some(&ingress), Some(&[]));
    // to_pod went onto B's host veth egress, on a pinned tcx link.
    assert!(
        datapath
            .link_path(flatnet_datapath::bpf::LinkRole::ToPod, "host-b")
            .exists()
    );
    for family in FAMILIES {
        let bi = b.ip(family);
        let probe_flow = Tuple::new(THIS_NODE.of(family), 50000, bi, 8080);
        let probe = b.receives(&b.sends(probe_flow.tcp(TCP_SYN)));
        node.check(
            &format!("{family:?} a probe from the node"),
            Hook::ToPod(b),
            &probe,
            TC_NEXT,
            &probe,
            &[],
        );
        // B's answer to the node passes its (empty) egress table.
        let answer = b.sends(probe_flow.reversed().tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} B answers the probe"),
            Hook::PodTc(b),
            &answer,
            TC_NEXT,
            &answer,
            &[("passed_to_stack", 1)],
        );
        let remote = b.receives(&b.sends(Tuple::new(REMOTE_POD.of(family), 1, bi, 2).udp()));
        node.check(
            &format!("{family:?} the remote pod through the stack"),
            Hook::ToPod(b),
            &remote,
            TC_NEXT,
            &remote,
            &[],
        );
        let outside = b.receives(&b.sends(Tuple::new(OUTSIDE.of(family), 1, bi, 2).udp()));
        node.check(
            &format!("{family:?} the outside through the stack"),
            Hook::ToPod(b),
            &outside,
            TC_ACT_SHOT,
            &outside,
            &[("policy_denied", 1)],
        );
    }
    // Neighbour discovery is never judged.
    let ns = neighbour_solicitation(THIS_NODE.v6, POD_B.v6, Some(HOST_B_MAC));
    let frame = ethernet(POD_B_MAC, HOST_B_MAC, ETH_P_IPV6, &ns);
    node.check(
        "a neighbour solicitation",
        Hook::ToPod(b),
        &frame,
        TC_NEXT,
        &frame,
        &[],
    );
    assert_eq!(node.policy_drops(b), (2, 0));
    // Policy state goes with the pod (its slot may be reused).
    datapath.remove_pod(b.host_ifindex, None).unwrap();
    assert_eq!(datapath.pod_policy(b.slot).unwrap().flags, 0);
    assert!(datapath.pod_policy_rules(b.slot).unwrap().is_empty());
}

//! NetworkPolicy in the programs, and its drop events.

use super::*;

// ---- NetworkPolicy -----------------------------------------------------------

/// TCP to `port` only.
pub(super) fn tcp_port(port: u16) -> PolicyPortRange {
    PolicyPortRange {
        protocol: IPPROTO_TCP,
        first: port,
        last: port,
    }
}

pub(super) fn udp_port(port: u16) -> PolicyPortRange {
    PolicyPortRange {
        protocol: IPPROTO_UDP,
        first: port,
        last: port,
    }
}

/// A rule for `cidr` allowing `ranges` (none: an explicit deny).
pub(super) fn rule(cidr: &str, ranges: &[PolicyPortRange]) -> PolicyRule {
    PolicyRule {
        cidr: cidr.parse().expect("CIDR"),
        ports: PolicyPorts::Ranges(ranges.to_vec()),
    }
}

pub(super) fn any_from(cidr: &str) -> PolicyRule {
    PolicyRule {
        cidr: cidr.parse().expect("CIDR"),
        ports: PolicyPorts::Any,
    }
}

impl Node {
    /// Isolates `pod` with these tables (in the node's namespace: the
    /// library attaches `to_pod` to the pod's host veth there).
    pub(super) fn set_policy(
        &self,
        pod: &Pod,
        ingress: Option<&[PolicyRule]>,
        egress: Option<&[PolicyRule]>,
    ) {
        let datapath = &self.scratch.datapath;
        self.netns
            .run(|| datapath.set_pod_policy(pod.slot, ingress, egress))
            .expect("writing a pod's policy");
    }

    /// What policy dropped of `pod`: (ingress, egress) packets.
    pub(super) fn policy_drops(&self, pod: &Pod) -> (u64, u64) {
        self.scratch
            .datapath
            .policy_drops(pod.slot)
            .expect("reading policy drops")
    }
}

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
        node.check(
            &format!("{family:?} unselected A to unselected B"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
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
            node.check(
                &format!("{family:?} {case} to B"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_REDIRECT,
                &b.receives(&frame),
                &[("redirected", 1)],
            );
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

/// An ICMP echo request of the addresses' family, as an IP packet.
pub(super) fn ip_echo(src: IpAddr, dst: IpAddr) -> (u16, Vec<u8>) {
    let (proto, message) = echo_request(src, dst);
    ip(src, dst, TTL, proto, &message)
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
        node.check(
            &format!("{family:?} A to B on 8080"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
        let frame = a.sends(Tuple::new(ai, 40001, bi, 9090).tcp(TCP_SYN));
        // Rewritten for B before the judgement; dropped all the same.
        node.check(
            &format!("{family:?} A to B on 9090"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &b.receives(&frame),
            &[("policy_denied", 1)],
        );
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

// ---- NetworkPolicy drop events (POLICY_EVENTS) -------------------------------

/// The events waiting in the node's `POLICY_EVENTS`.
pub(super) fn policy_events(node: &Node) -> Vec<PolicyEvent> {
    node.scratch
        .datapath
        .policy_events()
        .expect("opening POLICY_EVENTS")
        .drain()
}

/// An address as events carry it (IPv4 in the first 4 bytes).
pub(super) fn event_address(ip: IpAddr) -> [u8; 16] {
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

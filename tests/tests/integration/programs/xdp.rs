//! The XDP mode.

use super::*;

// ---- XDP mode ------------------------------------------------------------------------------

#[flatnet_test(root)]
fn xdp_packets_between_pods_are_redirected() {
    let node = Node::new(DatapathMode::Xdp);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        for (case, packet) in [("TCP", flow.tcp(TCP_SYN)), ("UDP", flow.udp())] {
            let frame = a.sends(packet);
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodXdp(a),
                &frame,
                XDP_REDIRECT,
                &b.receives(&frame),
                &[("redirected", 1)],
            );
        }
    }
    // XDP finds the sender's slot itself (HOST_VETHS): both pods' counters move.
    let datapath = &node.scratch.datapath;
    assert_eq!(datapath.slot_counters(a.slot).expect("A").tx_packets, 4);
    assert_eq!(datapath.slot_counters(b.slot).expect("B").rx_packets, 4);
}

#[flatnet_test(root)]
fn xdp_mode_enforces_policy_on_both_pods() {
    let node = Node::new(DatapathMode::Xdp);
    let (a, b) = (&node.a, &node.b);
    // A may open TCP 8080 and 9090 in the cluster; B takes only 8080 in.
    let ports = |ports: &[u16]| {
        let ranges: Vec<PolicyPortRange> = ports.iter().map(|p| tcp_port(*p)).collect();
        [
            rule("10.244.0.0/16", &ranges),
            rule("fd00:244::/32", &ranges),
        ]
    };
    node.set_policy(a, None, Some(&ports(&[8080, 9090])));
    node.set_policy(b, Some(&ports(&[8080])), None);
    for family in FAMILIES {
        for (port, verdict, counted) in [
            (8080, XDP_REDIRECT, "redirected"),
            // A's egress allows it, B's ingress does not.
            (9090, XDP_DROP, "policy_denied"),
            // A's egress does not.
            (7070, XDP_DROP, "policy_denied"),
        ] {
            let frame = a.sends(Tuple::new(a.ip(family), 40060, b.ip(family), port).tcp(TCP_SYN));
            node.check(
                &format!("{family:?} A's SYN to B:{port}"),
                Hook::PodXdp(a),
                &frame,
                verdict,
                &b.receives(&frame),
                &[(counted, 1)],
            );
        }
    }
    assert_eq!(node.policy_drops(a), (0, 2));
    assert_eq!(node.policy_drops(b), (2, 0));
}

#[flatnet_test(root)]
fn xdp_neighbour_questions_are_answered_with_xdp_tx() {
    let node = Node::new(DatapathMode::Xdp);
    let a = &node.a;
    let request = ethernet(
        BROADCAST,
        a.pod_mac,
        ETH_P_ARP,
        &arp(ARPOP_REQUEST, a.pod_mac, a.addresses.v4, [0; 6], POD_B.v4),
    );
    let reply = ethernet(
        a.pod_mac,
        a.host_mac,
        ETH_P_ARP,
        &arp(ARPOP_REPLY, a.host_mac, POD_B.v4, a.pod_mac, a.addresses.v4),
    );
    node.check(
        "ARP",
        Hook::PodXdp(a),
        &request,
        XDP_TX,
        &reply,
        &[("arp_answered", 1)],
    );
    let solicitation = ethernet(
        multicast_mac(solicited_node(POD_B.v6)),
        a.pod_mac,
        ETH_P_IPV6,
        &neighbour_solicitation(a.addresses.v6, POD_B.v6, Some(a.pod_mac)),
    );
    let advertisement = ethernet(
        a.pod_mac,
        a.host_mac,
        ETH_P_IPV6,
        &neighbour_advertisement(a.addresses.v6, POD_B.v6, a.host_mac),
    );
    node.check(
        "neighbour solicitation",
        Hook::PodXdp(a),
        &solicitation,
        XDP_TX,
        &advertisement,
        &[("nd_answered", 1)],
    );
}

#[flatnet_test(root)]
fn xdp_packets_from_an_address_not_the_pods_own_are_dropped() {
    let node = Node::new(DatapathMode::Xdp);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        for (case, src) in [("unused", UNUSED.of(family)), ("B's", b.ip(family))] {
            let frame = a.sends(Tuple::new(src, 40000, b.ip(family), 80).udp());
            node.check(
                &format!("{family:?} from {case} address"),
                Hook::PodXdp(a),
                &frame,
                XDP_DROP,
                &frame,
                &[("dropped", 1)],
            );
        }
    }
}

#[flatnet_test(root)]
fn xdp_checks_sources_in_the_senders_pod_sources_entry() {
    let node = Node::new(DatapathMode::Xdp);
    let (a, b) = (&node.a, &node.b);
    let datapath = &node.scratch.datapath;
    let from = |src: Ipv4Addr| a.sends(Tuple::new(src.into(), 40000, b.ip(Family::V4), 80).udp());
    // A with five more IPv4 addresses: its entry holds four of the six and
    // says there are more, so the other two are checked in ENDPOINTS_V4.
    let own: Vec<Ipv4Addr> = [a.addresses.v4]
        .into_iter()
        .chain((10..15).map(|n| Ipv4Addr::new(10, 244, 1, n)))
        .collect();
    let addresses: Vec<IpAddr> = own.iter().map(|ip| (*ip).into()).collect();
    datapath
        .insert_pod(a.endpoint(), &addresses, Shaping::default())
        .expect("A with six addresses");
    let entry = datapath.sources(a.slot).expect("A's sources");
    assert_ne!(entry.flags & SOURCES_F_MORE, 0, "{entry:?}");
    for src in &own {
        let frame = from(*src);
        node.check(
            &format!("from A's {src}"),
            Hook::PodXdp(a),
            &frame,
            XDP_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
    }
    let frame = from(UNUSED.v4);
    node.check(
        "from the unused address",
        Hook::PodXdp(a),
        &frame,
        XDP_DROP,
        &frame,
        &[("dropped", 1)],
    );
    // The entry decides when it is complete: rewritten to hold only the
    // unused address, that one passes and A's first address is dropped,
    // though ENDPOINTS_V4 still maps it to A.
    datapath
        .insert_pod(a.endpoint(), &[UNUSED.v4.into()], Shaping::default())
        .expect("A's entry rewritten");
    let frame = from(UNUSED.v4);
    node.check(
        "from the address the entry now holds",
        Hook::PodXdp(a),
        &frame,
        XDP_REDIRECT,
        &b.receives(&frame),
        &[("redirected", 1)],
    );
    let frame = from(a.addresses.v4);
    node.check(
        "from the address the entry no longer holds",
        Hook::PodXdp(a),
        &frame,
        XDP_DROP,
        &frame,
        &[("dropped", 1)],
    );
}

/// Cut-short IP headers run in XDP mode: test_run (Linux 6.18 here)
/// refuses an skb whose ethertype is IPv4 or IPv6 without a whole header
/// of it (EINVAL), so `from_pod` cannot be handed one; `from_pod_xdp` makes the
/// same decision (`decide`) on the same bytes.
#[flatnet_test(root)]
fn xdp_truncated_ip_headers_are_dropped() {
    let node = Node::new(DatapathMode::Xdp);
    let (a, b) = (&node.a, &node.b);
    let full_v4 = a.sends(Tuple::new(a.ip(Family::V4), 40000, b.ip(Family::V4), 80).udp());
    let full_v6 = a.sends(Tuple::new(a.ip(Family::V6), 40000, b.ip(Family::V6), 80).udp());
    // An IP ethertype without a whole IP header cannot be judged: dropped.
    for (case, frame) in [
        ("IPv4, no header", &full_v4[..ETH_LEN]),
        (
            "IPv4, 19 bytes of header",
            &full_v4[..ETH_LEN + IPV4_LEN - 1],
        ),
        ("IPv6, no header", &full_v6[..ETH_LEN]),
        (
            "IPv6, 39 bytes of header",
            &full_v6[..ETH_LEN + IPV6_LEN - 1],
        ),
    ] {
        node.check(
            case,
            Hook::PodXdp(a),
            frame,
            XDP_DROP,
            frame,
            &[("dropped", 1)],
        );
    }
}

#[flatnet_test(root)]
fn xdp_replies_of_translated_flows_go_to_the_stack() {
    let node = Node::new(DatapathMode::Xdp);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let request = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
        let reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40000);
        node.track("tcp", request, reply);
        let frame = b.sends(reply.tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} B's SYN-ACK"),
            Hook::PodXdp(b),
            &frame,
            XDP_PASS,
            &frame,
            &[("translated_to_stack", 1)],
        );
    }
}

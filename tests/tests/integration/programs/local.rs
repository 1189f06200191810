//! Between local pods: redirects, source addresses, malformed and unknown
//! frames.

use super::*;

// ---- Between local pods ----------------------------------------------------------

#[flatnet_test(root)]
fn packets_between_pods_are_redirected_with_the_peers_macs() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let mut delivered = 0;
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        for (case, packet) in [
            ("TCP SYN", flow.tcp(TCP_SYN)),
            ("TCP ACK", flow.tcp(TCP_ACK)),
            ("UDP", flow.udp()),
        ] {
            let frame = a.sends(packet);
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_REDIRECT,
                // The IP header is untouched: between two local pods there
                // is no routing hop.
                &b.receives(&frame),
                &[("redirected", 1)],
            );
            delivered += 1;
        }
    }
    // IPv6 BIG TCP: the kernel marks a segment above 64 KiB with a
    // Hop-by-Hop header holding only a jumbo payload option; the datapath
    // looks past it to the TCP header.
    let flow = Tuple::new(a.ip(Family::V6), 40000, b.ip(Family::V6), 8080);
    let jumbo = with_jumbo_hop_by_hop(&a.sends(flow.tcp(TCP_ACK)));
    node.check(
        "IPv6 BIG TCP segment",
        Hook::PodTc(a),
        &jumbo,
        TC_ACT_REDIRECT,
        &b.receives(&jumbo),
        &[("redirected", 1)],
    );
    delivered += 1;
    let received = node
        .scratch
        .datapath
        .slot_counters(b.slot)
        .expect("B's counters");
    assert_eq!(received.rx_packets, delivered, "B's per-pod rx counter");
}

/// An IPv6 frame as IPv6 BIG TCP sends it: payload length 0 and a
/// Hop-by-Hop header with a jumbo payload option (RFC 2675) carrying the
/// length (here the real, small one: the program reads only the headers).
pub(super) fn with_jumbo_hop_by_hop(frame: &[u8]) -> Vec<u8> {
    let ip = ETH_LEN;
    let (next_header, payload) = (frame[ip + 6], &frame[ip + IPV6_LEN..]);
    let jumbo_len = (payload.len() + 8) as u32;
    let mut out = frame[..ip + IPV6_LEN].to_vec();
    out[ip + 4..ip + 6].copy_from_slice(&[0, 0]);
    out[ip + 6] = 0;
    out.extend_from_slice(&[next_header, 0, 0xc2, 4]);
    out.extend_from_slice(&jumbo_len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Pods whose traffic the bandwidth plugin shapes: what a redirect would
/// carry past the qdiscs on their host veths goes to the stack instead,
/// unchanged (tc "next", so the `ingress` qdisc shaping a sender runs; XDP
/// pass), counted as `shaped_to_stack`. What the stack would get anyway,
/// and the neighbour answers, are as for any pod.
#[flatnet_test(root)]
fn traffic_of_shaped_pods_is_left_to_the_stack_and_its_qdiscs() {
    let (tc, xdp) = (Node::new(DatapathMode::Tc), Node::new(DatapathMode::Xdp));
    let shaped_into = Shaping {
        ingress: true,
        egress: false,
    };
    let shaped_out_of = Shaping {
        ingress: false,
        egress: true,
    };
    for family in FAMILIES {
        let (a, b) = (&tc.a, &tc.b);
        let to_b = a.sends(Tuple::new(a.ip(family), 40000, b.ip(family), 8080).udp());
        let to_remote = a.sends(Tuple::new(a.ip(family), 40000, REMOTE_POD.of(family), 8080).udp());
        let shaped = [("shaped_to_stack", 1)];

        // B's ingress shaped: A's packets for B, and the uplink's.
        tc.shape(b, shaped_into);
        tc.check(
            "A to ingress-shaped B",
            Hook::PodTc(a),
            &to_b,
            TC_NEXT,
            &to_b,
            &shaped,
        );
        let from_far = from_remote(REMOTE_POD.of(family), b.ip(family), TTL);
        tc.check(
            "remote pod to ingress-shaped B",
            Hook::Uplink,
            &from_far,
            TC_NEXT,
            &from_far,
            &shaped,
        );
        tc.shape(b, Shaping::default());
        tc.check(
            "A to B, unshaped again",
            Hook::PodTc(a),
            &to_b,
            TC_ACT_REDIRECT,
            &b.receives(&to_b),
            &[("redirected", 1)],
        );

        // A's egress shaped: to a local pod and to another node's.
        tc.shape(a, shaped_out_of);
        tc.check(
            "egress-shaped A to B",
            Hook::PodTc(a),
            &to_b,
            TC_NEXT,
            &to_b,
            &shaped,
        );
        tc.check(
            "egress-shaped A to a remote pod",
            Hook::PodTc(a),
            &to_remote,
            TC_NEXT,
            &to_remote,
            &shaped,
        );
        let foreign = a.sends(Tuple::new(OUTSIDE.of(family), 40000, b.ip(family), 80).udp());
        tc.check(
            "egress-shaped A still checked for its source",
            Hook::PodTc(a),
            &foreign,
            TC_ACT_SHOT,
            &foreign,
            &[("dropped", 1)],
        );
        tc.shape(a, Shaping::default());

        // XDP mode: a redirect skips every qdisc, so the stack takes both.
        let (a, b) = (&xdp.a, &xdp.b);
        let to_b = a.sends(Tuple::new(a.ip(family), 40000, b.ip(family), 8080).udp());
        for (case, pod, shaping) in [
            ("XDP: A to ingress-shaped B", b, shaped_into),
            ("XDP: egress-shaped A to B", a, shaped_out_of),
        ] {
            xdp.shape(pod, shaping);
            xdp.check(case, Hook::PodXdp(a), &to_b, XDP_PASS, &to_b, &shaped);
            xdp.shape(pod, Shaping::default());
        }
    }
}

#[flatnet_test(root)]
fn packets_for_no_local_pod_pass_unchanged() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    for family in FAMILIES {
        // An address outside, one of the subnet nobody has, the pod itself.
        for (case, dst) in [
            ("outside", OUTSIDE.of(family)),
            ("unused", UNUSED.of(family)),
            ("itself", a.ip(family)),
        ] {
            let frame = a.sends(Tuple::new(a.ip(family), 40000, dst, 80).tcp(TCP_SYN));
            node.check(
                &format!("{family:?} to {case}"),
                Hook::PodTc(a),
                &frame,
                TC_NEXT,
                &frame,
                &[("passed_to_stack", 1)],
            );
        }
    }
}

#[flatnet_test(root)]
fn short_icmpv6_between_pods_is_redirected() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // 8 bytes of ICMPv6, shorter than any neighbour solicitation: it must
    // not be taken for a truncated one. ICMP echo of IPv4 likewise.
    for family in FAMILIES {
        let (proto, echo) = echo_request(a.ip(family), b.ip(family));
        let frame = a.sends(ip(a.ip(family), b.ip(family), TTL, proto, &echo));
        node.check(
            &format!("{family:?} echo request"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
    }
}

// ---- Source addresses -------------------------------------------------------------

#[flatnet_test(root)]
fn packets_from_an_address_not_the_pods_own_are_dropped() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        // An unused address and another pod's, to a pod and to the outside.
        for (case, src) in [("unused", UNUSED.of(family)), ("B's", b.ip(family))] {
            for dst in [b.ip(family), OUTSIDE.of(family)] {
                let frame = a.sends(Tuple::new(src, 40000, dst, 80).udp());
                node.check(
                    &format!("{family:?} from {case} address to {dst}"),
                    Hook::PodTc(a),
                    &frame,
                    TC_ACT_SHOT,
                    &frame,
                    &[("dropped", 1)],
                );
            }
        }
    }
}

#[flatnet_test(root)]
fn link_local_sources_reach_only_the_link() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    let link_local_a: Ipv6Addr = "fe80::a".parse().expect("address");
    let all_routers: Ipv6Addr = "ff02::2".parse().expect("address");
    // A router solicitation (type 133, the source link-layer option).
    let body = [&[0, 0, 0, 0, 1, 1][..], &a.pod_mac].concat();
    let message = icmpv6(link_local_a, all_routers, 133, 0, &body);
    let to_routers = a.sends((
        ETH_P_IPV6,
        ipv6(
            link_local_a,
            all_routers,
            ND_HOP_LIMIT,
            IPPROTO_ICMPV6,
            &message,
        ),
    ));
    node.check(
        "router solicitation to ff02::2",
        Hook::PodTc(a),
        &to_routers,
        TC_NEXT,
        &to_routers,
        &[("passed_to_stack", 1)],
    );
    // A link-local source must never be forwarded: to a pod or outside.
    for dst in [POD_B.of(Family::V6), OUTSIDE.of(Family::V6)] {
        let frame = a.sends(Tuple::new(link_local_a.into(), 40000, dst, 80).udp());
        node.check(
            &format!("link-local to {dst}"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &frame,
            &[("dropped", 1)],
        );
    }
}

// ---- Malformed and unknown frames -----------------------------------------------------

#[flatnet_test(root)]
fn frames_the_datapath_cannot_judge_pass_unchanged() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let udp_v4 = Tuple::new(a.ip(Family::V4), 40000, b.ip(Family::V4), 80).udp();
    // A VLAN tag in front of IPv4 (a pod never sends one; the host decides).
    let tagged = ethernet(
        a.host_mac,
        a.pod_mac,
        ETH_P_8021Q,
        &[&[0, 100][..], &ETH_P_IP.to_be_bytes(), &udp_v4.1].concat(),
    );
    // An ARP request cut short.
    let short_arp = ethernet(
        BROADCAST,
        a.pod_mac,
        ETH_P_ARP,
        &arp(ARPOP_REQUEST, a.pod_mac, a.addresses.v4, [0; 6], POD_B.v4)[..20],
    );
    let unknown = ethernet(a.host_mac, a.pod_mac, 0x88b5, b"local experimental");
    let mut cases = vec![
        ("VLAN-tagged".to_string(), tagged),
        ("short ARP".to_string(), short_arp),
        ("unknown ethertype".to_string(), unknown),
    ];
    // A whole IP header, the TCP or UDP one cut short, between two pods:
    // conntrack cannot be asked, the stack takes it.
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 80);
        let header_len = ETH_LEN + family.ip_header_len();
        for (proto, frame) in [
            ("TCP", a.sends(flow.tcp(TCP_ACK))),
            ("UDP", a.sends(flow.udp())),
        ] {
            cases.push((
                format!("{family:?} {proto}, 3 bytes of it"),
                frame[..header_len + 3].to_vec(),
            ));
        }
    }
    for (case, frame) in cases {
        node.check(
            &case,
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("passed_to_stack", 1)],
        );
    }
}

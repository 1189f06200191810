//! Cross-node: from a pod to another node, from the uplink to a pod.

use super::*;

// ---- Cross-node: from a pod to another node, from the uplink to a pod ---------------------

#[flatnet_test(root)]
fn packets_for_another_nodes_pod_leave_by_the_kernels_route() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    let to = |family: Family, dst: DualStack, ttl: u8| {
        let datagram = udp(a.ip(family), dst.of(family), 40000, 8080, b"query");
        a.sends(ip(
            a.ip(family),
            dst.of(family),
            ttl,
            IPPROTO_UDP,
            &datagram,
        ))
    };
    // Forwarding off and no route yet: the FIB has no answer, the stack
    // takes the packet as it is.
    for family in FAMILIES {
        let frame = to(family, REMOTE_POD, TTL);
        node.check(
            &format!("{family:?} without a route"),
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("remote_passed_to_stack", 1)],
        );
    }
    node.route_remote_cidrs();
    for family in FAMILIES {
        // Resolved: the MACs the FIB found, one hop older (built anew here
        // with TTL 63 and its checksum from scratch), bpf_redirect.
        let frame = to(family, REMOTE_POD, TTL);
        let routed = with_macs(
            &to(family, REMOTE_POD, TTL - 1),
            REMOTE_NODE_MAC,
            UPLINK_MAC,
        );
        let outcome = node.check(
            &format!("{family:?} to a resolved next hop"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &routed,
            &[("to_remote_node", 1)],
        );
        if family == Family::V4 {
            assert_eq!(
                checksum(&outcome.frame[ETH_LEN..ETH_LEN + IPV4_LEN]),
                0,
                "IPv4 header checksum after the TTL decrement"
            );
        }
        // Unresolved: one hop older, MACs left for bpf_redirect_neigh.
        let frame = to(family, UNRESOLVED_POD, TTL);
        node.check(
            &format!("{family:?} to an unresolved next hop"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &to(family, UNRESOLVED_POD, TTL - 1),
            &[("to_remote_node", 1)],
        );
        // Expiring: the stack answers it with ICMP time exceeded.
        let frame = to(family, REMOTE_POD, 1);
        node.check(
            &format!("{family:?} with TTL 1"),
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("remote_passed_to_stack", 1)],
        );
    }
}

/// A frame from another node on the uplink, addressed to this node's
/// uplink (the host's MAC: test_run's skb then gets PACKET_HOST).
pub(super) fn from_remote(src: IpAddr, dst: IpAddr, ttl: u8) -> Vec<u8> {
    let datagram = udp(src, dst, 8080, 40000, b"answer");
    let (ethertype, packet) = ip(src, dst, ttl, IPPROTO_UDP, &datagram);
    ethernet(UPLINK_MAC, REMOTE_NODE_MAC, ethertype, &packet)
}

#[flatnet_test(root)]
fn uplink_packets_from_remote_pods_are_redirected_one_hop_older() {
    let node = Node::new(DatapathMode::Tc);
    let b = &node.b;
    for family in FAMILIES {
        let (src, dst) = (REMOTE_POD.of(family), b.ip(family));
        let frame = from_remote(src, dst, TTL);
        // TTL (hop limit) one less, the IPv4 checksum patched: built anew
        // here with TTL 63 and a checksum computed from scratch.
        let forwarded = b.receives(&from_remote(src, dst, TTL - 1));
        let outcome = node.check(
            &format!("{family:?} remote pod to B"),
            Hook::Uplink,
            &frame,
            TC_ACT_REDIRECT,
            &forwarded,
            &[("uplink_to_pod", 1)],
        );
        if family == Family::V4 {
            assert_eq!(
                checksum(&outcome.frame[ETH_LEN..ETH_LEN + IPV4_LEN]),
                0,
                "IPv4 header checksum after the TTL decrement"
            );
        }
    }
    let received = node
        .scratch
        .datapath
        .slot_counters(b.slot)
        .expect("B's counters");
    assert_eq!(received.rx_packets, 2, "B's per-pod rx counter");
}

#[flatnet_test(root)]
fn ttl_decrements_keep_the_ipv4_checksum_valid_across_the_carry() {
    let node = Node::new(DatapathMode::Tc);
    let b = &node.b;
    let (src, dst) = (REMOTE_POD.v4, b.addresses.v4);
    let datagram = udp(src.into(), dst.into(), 8080, 40000, b"answer");
    let packet = |id: u16, ttl: u8| ipv4_with_id(src, dst, ttl, IPPROTO_UDP, id, &datagram);
    // The decrement adds 0x0100 to the checksum: headers whose checksum is
    // at, just under and past the point where that carries (the
    // identification picks the checksum).
    for wanted in [0x0000, 0x00ff, 0xfe00, 0xfeff, 0xff00, 0xff01, 0xfffe] {
        let id = (0..=u16::MAX)
            .find(|id| {
                let header = packet(*id, TTL);
                u16::from_be_bytes([header[10], header[11]]) == wanted
            })
            .expect("an identification for the checksum");
        let frame = ethernet(UPLINK_MAC, REMOTE_NODE_MAC, ETH_P_IP, &packet(id, TTL));
        let outcome = node.try_run(Hook::Uplink, &frame).expect("test run");
        assert_eq!(outcome.verdict, TC_ACT_REDIRECT, "checksum {wanted:#06x}");
        let header = &outcome.frame[ETH_LEN..ETH_LEN + IPV4_LEN];
        assert_eq!(header[8], TTL - 1, "checksum {wanted:#06x}: TTL");
        assert_eq!(
            checksum(header),
            0,
            "checksum {wanted:#06x} became {:#04x}{:02x}",
            header[10],
            header[11]
        );
    }
}

#[flatnet_test(root)]
fn uplink_leaves_to_the_stack_what_is_not_a_remote_pods_for_a_local_pod() {
    let node = Node::new(DatapathMode::Tc);
    let b = &node.b;
    for family in FAMILIES {
        let (remote, local) = (REMOTE_POD.of(family), b.ip(family));
        let to_other_host = with_macs(
            &from_remote(remote, local, TTL),
            [0x02, 0, 0, 0, 0, 0x77],
            REMOTE_NODE_MAC,
        );
        for (case, frame) in [
            // Expiring: the stack sends the time exceeded.
            ("TTL 1", from_remote(remote, local, 1)),
            // From a node's own address or the outside: the replies take
            // the stack, so this direction must too.
            (
                "from a node",
                from_remote(REMOTE_NODE.of(family), local, TTL),
            ),
            ("from outside", from_remote(OUTSIDE.of(family), local, TTL)),
            // Not for a local pod.
            ("to no pod", from_remote(remote, UNUSED.of(family), TTL)),
            // Addressed to another host's MAC (PACKET_OTHERHOST).
            ("to another MAC", to_other_host),
        ] {
            node.check(
                &format!("{family:?} {case}"),
                Hook::Uplink,
                &frame,
                TC_NEXT,
                &frame,
                &[],
            );
        }
    }
}

#[flatnet_test(root)]
fn uplink_hands_nothing_to_pods_in_xdp_mode() {
    let node = Node::new(DatapathMode::Xdp);
    // XDP mode sends pods' packets for other nodes through the stack, so
    // the replies must take it too.
    for family in FAMILIES {
        let frame = from_remote(REMOTE_POD.of(family), node.b.ip(family), TTL);
        node.check(
            &format!("{family:?} remote pod to B"),
            Hook::Uplink,
            &frame,
            TC_NEXT,
            &frame,
            &[],
        );
    }
}

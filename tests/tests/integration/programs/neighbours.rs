//! ARP and NDP answered in place by the programs.

use super::*;

// ---- Neighbours: ARP and NDP answered in place ------------------------------

#[flatnet_test(root)]
fn arp_requests_are_answered_with_the_host_veth_mac() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    // For another pod and for an address outside: the pod must send both
    // to its host veth.
    for target in [POD_B.v4, OUTSIDE.v4] {
        let request = ethernet(
            BROADCAST,
            a.pod_mac,
            ETH_P_ARP,
            &arp(ARPOP_REQUEST, a.pod_mac, a.addresses.v4, [0; 6], target),
        );
        let reply = ethernet(
            a.pod_mac,
            a.host_mac,
            ETH_P_ARP,
            &arp(ARPOP_REPLY, a.host_mac, target, a.pod_mac, a.addresses.v4),
        );
        node.check(
            &format!("who-has {target}"),
            Hook::PodTc(a),
            &request,
            TC_ACT_REDIRECT,
            &reply,
            &[("arp_answered", 1)],
        );
    }
}

#[flatnet_test(root)]
fn arp_probes_and_announcements_pass_unchanged() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    // A probe (sender 0.0.0.0, RFC 5227) and a gratuitous ARP (sender =
    // target): answering either would tell the pod its address is taken.
    let probe = arp(
        ARPOP_REQUEST,
        a.pod_mac,
        Ipv4Addr::UNSPECIFIED,
        [0; 6],
        a.addresses.v4,
    );
    let announcement = arp(
        ARPOP_REQUEST,
        a.pod_mac,
        a.addresses.v4,
        [0; 6],
        a.addresses.v4,
    );
    // A reply is not the datapath's to answer either.
    let reply = arp(ARPOP_REPLY, a.pod_mac, a.addresses.v4, a.host_mac, POD_B.v4);
    for (case, message) in [
        ("probe", probe),
        ("announcement", announcement),
        ("reply", reply),
    ] {
        let frame = ethernet(BROADCAST, a.pod_mac, ETH_P_ARP, &message);
        node.check(
            case,
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("passed_to_stack", 1)],
        );
    }
}

#[flatnet_test(root)]
fn neighbour_solicitations_become_advertisements_of_the_host_veth_mac() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    let link_local_a: Ipv6Addr = "fe80::a".parse().expect("address");
    let gateway: Ipv6Addr = "fe80::1".parse().expect("address");
    // From the pod's own address for another pod, and from its link-local
    // address for its gateway (how a default route is resolved).
    for (asker, target) in [(a.addresses.v6, POD_B.v6), (link_local_a, gateway)] {
        let solicitation = ethernet(
            multicast_mac(solicited_node(target)),
            a.pod_mac,
            ETH_P_IPV6,
            &neighbour_solicitation(asker, target, Some(a.pod_mac)),
        );
        let advertisement = ethernet(
            a.pod_mac,
            a.host_mac,
            ETH_P_IPV6,
            &neighbour_advertisement(asker, target, a.host_mac),
        );
        let case = format!("{asker} asks for {target}");
        let outcome = node.check(
            &case,
            Hook::PodTc(a),
            &solicitation,
            TC_ACT_REDIRECT,
            &advertisement,
            &[("nd_answered", 1)],
        );
        // The equality above covers the checksum; checked on its own too,
        // so that a failure says so.
        let message = &outcome.frame[ETH_LEN + IPV6_LEN..];
        let covered = [
            pseudo_header(target.into(), asker.into(), IPPROTO_ICMPV6, message.len()),
            message.to_vec(),
        ]
        .concat();
        assert_eq!(checksum(&covered), 0, "{case}: ICMPv6 checksum");
    }
}

#[flatnet_test(root)]
fn duplicate_address_detection_passes_unchanged() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    // DAD comes from :: and has no source link-layer option (RFC 4862); one
    // with the option has the exact shape the datapath answers, so it
    // reaches the check for the unspecified source too.
    for (case, option) in [("plain", None), ("with an option", Some(a.pod_mac))] {
        let frame = ethernet(
            multicast_mac(solicited_node(a.addresses.v6)),
            a.pod_mac,
            ETH_P_IPV6,
            &neighbour_solicitation(Ipv6Addr::UNSPECIFIED, a.addresses.v6, option),
        );
        node.check(
            case,
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("passed_to_stack", 1)],
        );
    }
}

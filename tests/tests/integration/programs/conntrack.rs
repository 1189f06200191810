//! Flows the host's conntrack tracks stay on the stack path.

use super::*;

// ---- Flows the host's conntrack tracks -------------------------------------------------

pub(super) const SERVICE_PORT: u16 = 80;
pub(super) const BACKEND_PORT: u16 = 8080;

#[flatnet_test(root)]
fn replies_of_translated_flows_go_to_the_stack() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        // A asked the ClusterIP, the host sent it to B: B's replies must
        // meet the entry to come back from the ClusterIP.
        for proto in ["tcp", "udp"] {
            let request = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
            let reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40000);
            node.track(proto, request, reply);
            let packets = if proto == "tcp" {
                vec![
                    ("SYN-ACK", reply.tcp(TCP_SYN | TCP_ACK)),
                    ("ACK", reply.tcp(TCP_ACK)),
                ]
            } else {
                vec![("datagram", reply.udp())]
            };
            for (case, packet) in packets {
                let frame = b.sends(packet);
                node.check(
                    &format!("{family:?} {proto} {case} of B's reply"),
                    Hook::PodTc(b),
                    &frame,
                    TC_NEXT,
                    &frame,
                    &[("translated_to_stack", 1)],
                );
            }
            // The same packets of a flow the host never saw: fast path.
            let untracked = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40001);
            let packet = if proto == "tcp" {
                untracked.tcp(TCP_ACK)
            } else {
                untracked.udp()
            };
            let frame = b.sends(packet);
            node.check(
                &format!("{family:?} {proto} without an entry"),
                Hook::PodTc(b),
                &frame,
                TC_ACT_REDIRECT,
                &a.receives(&frame),
                &[("redirected", 1)],
            );
        }
    }
}

#[flatnet_test(root)]
fn packets_of_tracked_flows_go_to_the_stack() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        for proto in ["tcp", "udp"] {
            // A flow between the two pods the host saw untranslated (its
            // first packet went through the stack): both directions must
            // keep meeting the entry.
            let forward = Tuple::new(a.ip(family), 40010, b.ip(family), 9000);
            node.track(proto, forward, forward.reversed());
            for (who, sender, tuple) in [("A", a, forward), ("B", b, forward.reversed())] {
                let packet = if proto == "tcp" {
                    tuple.tcp(TCP_ACK)
                } else {
                    tuple.udp()
                };
                let frame = sender.sends(packet);
                node.check(
                    &format!("{family:?} {proto} from {who}"),
                    Hook::PodTc(sender),
                    &frame,
                    TC_NEXT,
                    &frame,
                    &[("tracked_to_stack", 1)],
                );
            }
        }
    }
}

#[flatnet_test(root)]
fn tcp_verdicts_hold_until_the_next_syn() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let forward = Tuple::new(a.ip(family), 40020, b.ip(family), 9000);
        let reply = forward.reversed();
        node.track("tcp", forward, reply);
        let ack = b.sends(reply.tcp(TCP_ACK));
        let syn_ack = b.sends(reply.tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} ACK of a tracked flow"),
            Hook::PodTc(b),
            &ack,
            TC_NEXT,
            &ack,
            &[("tracked_to_stack", 1)],
        );
        // The entry goes; TCP_FLOWS still says "tracked" for this direction
        // until a SYN asks conntrack again (a new connection on the same
        // ports starts with one).
        node.untrack("tcp", forward);
        node.check(
            &format!("{family:?} ACK after the entry went"),
            Hook::PodTc(b),
            &ack,
            TC_NEXT,
            &ack,
            &[("tracked_to_stack", 1)],
        );
        node.check(
            &format!("{family:?} SYN-ACK after the entry went"),
            Hook::PodTc(b),
            &syn_ack,
            TC_ACT_REDIRECT,
            &a.receives(&syn_ack),
            &[("redirected", 1)],
        );
        node.check(
            &format!("{family:?} ACK after the SYN-ACK"),
            Hook::PodTc(b),
            &ack,
            TC_ACT_REDIRECT,
            &a.receives(&ack),
            &[("redirected", 1)],
        );
    }
}

#[flatnet_test(root)]
fn icmp_errors_are_judged_by_the_packet_they_quote() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        // A sent UDP to the ClusterIP, the host sent it on to B, where
        // nothing listens: B's port unreachable quotes A -> B:8080 and must
        // reach A through the stack, rewritten to come from the ClusterIP.
        let request = Tuple::new(a.ip(family), 40030, CLUSTER_IP.of(family), 53);
        let translated = Tuple::new(a.ip(family), 40030, b.ip(family), BACKEND_PORT);
        node.track("udp", request, translated.reversed());
        let unreachable_about = |quoted: Tuple| {
            let (_, quoted_packet) = quoted.udp();
            let (proto, message) = port_unreachable(b.ip(family), a.ip(family), &quoted_packet);
            b.sends(ip(b.ip(family), a.ip(family), TTL, proto, &message))
        };
        let frame = unreachable_about(translated);
        node.check(
            &format!("{family:?} port unreachable of a translated flow"),
            Hook::PodTc(b),
            &frame,
            TC_NEXT,
            &frame,
            &[("translated_to_stack", 1)],
        );
        // One about a flow the host never saw keeps the fast path.
        let frame = unreachable_about(Tuple::new(a.ip(family), 40031, b.ip(family), BACKEND_PORT));
        node.check(
            &format!("{family:?} port unreachable of a direct flow"),
            Hook::PodTc(b),
            &frame,
            TC_ACT_REDIRECT,
            &a.receives(&frame),
            &[("redirected", 1)],
        );
    }
}

#[flatnet_test(root)]
fn uplink_replies_of_translated_flows_go_to_the_stack() {
    let node = Node::new(DatapathMode::Tc);
    let a = &node.a;
    for family in FAMILIES {
        // A's ClusterIP flow went to a backend on another node; its reply
        // comes back over the uplink and must meet this node's entry.
        let request = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
        let reply = Tuple::new(REMOTE_POD.of(family), BACKEND_PORT, a.ip(family), 40000);
        node.track("udp", request, reply);
        let frame = from_remote(reply.src, reply.dst, TTL);
        node.check(
            &format!("{family:?} remote backend's reply"),
            Hook::Uplink,
            &frame,
            TC_NEXT,
            // Untouched: not even the TTL, the stack forwards it.
            &frame,
            &[("translated_to_stack", 1)],
        );
    }
}

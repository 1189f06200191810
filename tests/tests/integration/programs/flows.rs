//! The answers the fast path keeps (`FLOWS`): kept for UDP as for TCP, taken
//! back when the host stack carries a packet of the flow (`to_pod` into a
//! pod, `to_uplink` to another node; the fast path's own marked packets
//! excepted), and forgotten under pressure with nothing worse than asking
//! conntrack again.

use std::net::SocketAddr;

use flatnet_common::{FAST_PATH_MARK, MAX_FLOWS, PROG_TO_UPLINK, verdict};
use flatnet_datapath::bpf::flow_key;
use flatnet_tests::test_run::run_tc_marked;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

use super::*;

const IPPROTO_UDP: u8 = 17;

/// The key of `tuple`'s direction.
fn key_of(tuple: Tuple, proto: u8) -> flatnet_common::FlowKey {
    flow_key(
        SocketAddr::new(tuple.src, tuple.sport),
        SocketAddr::new(tuple.dst, tuple.dport),
        proto,
    )
}

impl Node {
    fn kept(&self, tuple: Tuple) -> Option<u32> {
        self.scratch
            .datapath
            .flow_verdict(&key_of(tuple, IPPROTO_UDP))
            .expect("reading FLOWS")
    }
}

/// A UDP flow between two local pods gets "clear" kept for each direction
/// from its first packet, and later packets take the answer without asking
/// conntrack: an entry the host makes behind the datapath's back (here
/// with `conntrack -I`) changes nothing. The host makes one only by
/// carrying a packet of the flow, which leaves it through `to_pod` (here
/// run on the packet as the stack delivers it): the "clear" of both
/// directions goes, and the next packet asks conntrack and goes to the
/// stack.
#[flatnet_test(root)]
fn udp_answers_are_kept_until_the_stack_carries_the_flow() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let request = Tuple::new(a.ip(family), 40000, b.ip(family), BACKEND_PORT);
        let reply = request.reversed();
        for (case, from, tuple) in [("request", a, request), ("reply", b, reply)] {
            let frame = from.sends(tuple.udp());
            let to = if case == "request" { b } else { a };
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodTc(from),
                &frame,
                TC_ACT_REDIRECT,
                &to.receives(&frame),
                &[("redirected", 1)],
            );
            assert_eq!(node.kept(tuple), Some(verdict::CLEAR), "{family:?} {case}");
        }
        // The host translates a flow of this tuple now (A asked a
        // ClusterIP from the same port): the kept answer still holds...
        let via_service = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
        node.track("udp", via_service, reply);
        let frame = b.sends(reply.udp());
        node.check(
            &format!("{family:?} reply, entry made behind the datapath's back"),
            Hook::PodTc(b),
            &frame,
            TC_ACT_REDIRECT,
            &a.receives(&frame),
            &[("redirected", 1)],
        );
        // ...until the stack delivers the translated request into B.
        let delivered = b.receives(&b.sends(request.udp()));
        node.check(
            &format!("{family:?} the stack's delivery into B"),
            Hook::ToPod(b),
            &delivered,
            TC_NEXT,
            &delivered,
            &[],
        );
        assert_eq!(node.kept(request), None, "{family:?} request's answer");
        assert_eq!(node.kept(reply), None, "{family:?} reply's answer");
        node.check(
            &format!("{family:?} reply after the stack carried the flow"),
            Hook::PodTc(b),
            &frame,
            TC_NEXT,
            &frame,
            &[("translated_to_stack", 1)],
        );
        assert_eq!(node.kept(reply), Some(verdict::TRANSLATED), "{family:?}");
    }
}

/// `to_uplink` takes a "clear" back for what the stack sends to another
/// node, and leaves it for the fast path's own packets, which carry
/// `FAST_PATH_MARK` (cleared on the way out: the wire and the qdiscs after
/// it never see it). Other marks (kube-proxy's, anyone's) stay as they are.
#[flatnet_test(root)]
fn to_uplink_takes_back_clear_answers_of_the_stacks_packets_only() {
    let node = Node::new(DatapathMode::Tc);
    let b = &node.b;
    let path = node.scratch.program_path(PROG_TO_UPLINK);
    for family in FAMILIES {
        let (remote, local) = (REMOTE_POD.of(family), b.ip(family));
        // `from_remote`'s datagram: remote:8080 -> local:40000.
        let incoming = Tuple::new(remote, 8080, local, 40000);
        node.try_run(Hook::Uplink, &from_remote(remote, local, TTL))
            .expect("from_uplink");
        assert_eq!(node.kept(incoming), Some(verdict::CLEAR), "{family:?}");
        let outgoing = ethernet(
            REMOTE_NODE_MAC,
            UPLINK_MAC,
            incoming.reversed().udp().0,
            &incoming.reversed().udp().1,
        );
        let run = |mark: u32| {
            node.netns
                .run(|| run_tc_marked(&path, &outgoing, node.uplink_ifindex, mark))
                .expect("to_uplink")
        };
        let (outcome, mark) = run(FAST_PATH_MARK);
        assert_eq!(
            (outcome.verdict, mark),
            (TC_NEXT, 0),
            "{family:?} fast path's packet"
        );
        assert_eq!(node.kept(incoming), Some(verdict::CLEAR), "{family:?} kept");
        let (outcome, mark) = run(0x4000);
        assert_eq!(
            (outcome.verdict, mark),
            (TC_NEXT, 0x4000),
            "{family:?} stack's packet"
        );
        assert_eq!(node.kept(incoming), None, "{family:?} taken back");
    }
}

/// More flows than `FLOWS` holds: the oldest answers are forgotten, and a
/// forgotten "clear" of a flow the host translates by now costs one
/// conntrack lookup, never a reply that skips the translation.
#[flatnet_test(root)]
fn a_full_flows_map_forgets_and_asks_conntrack_again() {
    // A new LRU entry waits on the list of the CPU that made it until that
    // CPU makes another; the fill below would evict around an entry the
    // program made on the other CPU for ever (CI saw it). The program runs
    // on the calling thread's CPU, so both share one here; a busy node's
    // CPUs all make entries.
    on_one_cpu();
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let request = Tuple::new(a.ip(Family::V4), 40001, b.ip(Family::V4), BACKEND_PORT);
    let reply = request.reversed();
    let frame = b.sends(reply.udp());
    node.try_run(Hook::PodTc(b), &frame).expect("reply");
    assert_eq!(node.kept(reply), Some(verdict::CLEAR));
    let via_service = Tuple::new(
        a.ip(Family::V4),
        40001,
        CLUSTER_IP.of(Family::V4),
        SERVICE_PORT,
    );
    node.track("udp", via_service, reply);
    // The map's size in other flows at a time, as a busy node would see
    // them, until the reply's answer is forgotten: an LRU map's eviction is
    // approximate (per-CPU lists, a recently read entry kept longer), so
    // how many rounds that takes is the kernel's choice.
    let datapath = &node.scratch.datapath;
    let mut rounds = 0;
    while node.kept(reply).is_some() {
        assert!(
            rounds < 8,
            "{rounds} times FLOWS' size kept the reply's answer"
        );
        for n in 0..MAX_FLOWS {
            let [_, hi, mid, lo] = (rounds * MAX_FLOWS + n).to_be_bytes();
            let other = Tuple::new(
                IpAddr::V4(Ipv4Addr::new(10, 200 + hi, mid, lo)),
                1000,
                b.ip(Family::V4),
                53,
            );
            datapath
                .keep_flow(&key_of(other, IPPROTO_UDP), verdict::CLEAR)
                .expect("filling FLOWS");
        }
        rounds += 1;
        let count = datapath.flow_count().expect("counting FLOWS");
        assert!(count <= MAX_FLOWS as usize, "{count} entries");
    }
    node.check(
        "reply of a translated flow, its answer forgotten",
        Hook::PodTc(b),
        &frame,
        TC_NEXT,
        &frame,
        &[("translated_to_stack", 1)],
    );
}

/// Keeps this thread, and the namespace threads it spawns, on CPU 0.
fn on_one_cpu() {
    let mut cpus = CpuSet::new();
    cpus.set(0).expect("CPU 0");
    sched_setaffinity(Pid::from_raw(0), &cpus).expect("pinning the test to CPU 0");
}

/// "NodePort reply", which the NodePort path keeps for the replies' tuple
/// of a flow it translates keeping the client's address, sends that
/// tuple's packets to the reply path (`nodeport_reply`): with no such flow
/// there, the stack takes them, untouched. At a SYN it holds only while
/// the flow is in `NAT_REVERSE`: a new connection on the tuple (its
/// SYN-ACK) is judged anew by conntrack, takes the fast path, and its
/// answer replaces the mark. (With the flow there, `nodeport_local` in the
/// integration suite shows the replies translated, TCP and UDP.)
#[flatnet_test(root)]
fn a_nodeport_reply_mark_without_its_flow_leaves_packets_to_the_stack() {
    const IPPROTO_TCP: u8 = 6;
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let datapath = &node.scratch.datapath;
    for family in FAMILIES {
        let reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40100);
        for proto in [IPPROTO_TCP, IPPROTO_UDP] {
            datapath
                .keep_flow(&key_of(reply, proto), verdict::NODEPORT_REPLY)
                .expect("keeping the mark");
        }
        for (case, frame) in [
            ("tcp ACK", b.sends(reply.tcp(TCP_ACK))),
            ("udp", b.sends(reply.udp())),
        ] {
            node.check(
                &format!("{family:?} {case} under the mark"),
                Hook::PodTc(b),
                &frame,
                TC_NEXT,
                &frame,
                &[],
            );
        }
        let frame = b.sends(reply.tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} SYN-ACK of a new connection"),
            Hook::PodTc(b),
            &frame,
            TC_ACT_REDIRECT,
            &a.receives(&frame),
            &[("redirected", 1)],
        );
        assert_eq!(
            datapath
                .flow_verdict(&key_of(reply, IPPROTO_TCP))
                .expect("reading FLOWS"),
            Some(verdict::CLEAR),
            "{family:?}: the SYN-ACK's answer replaces the mark"
        );
    }
}

//! What one run of a program costs on each kind of frame, timed by the
//! kernel over many runs (`BPF_PROG_TEST_RUN`'s repeat): where the
//! nanoseconds of a packet go. A measurement, not a check of speed: it
//! asserts only the verdicts, and `cargo xtask bench` reports the numbers.

use super::*;
use flatnet_common::{PROG_TO_UPLINK, external_port};
use flatnet_datapath::bpf::{PeerRule, PolicyPorts, PolicyTable};
use flatnet_tests::test_run::{TC_ACT_SHOT, time_tc};

/// Runs per measurement: long enough that the timer's resolution and the
/// first run's cache misses vanish in the average.
const REPEAT: u32 = 200_000;

/// Each case's average ns per run, written as JSON lines to
/// `FLATNET_PROGRAM_COST` when set, printed always.
#[flatnet_test(root)]
#[ignore = "a measurement: `cargo xtask bench` runs it"]
fn program_cost_per_frame() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let family = Family::V4;
    let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
    let translated_reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40001);
    node.track(
        "udp",
        Tuple::new(a.ip(family), 40001, CLUSTER_IP.of(family), SERVICE_PORT),
        translated_reply,
    );
    let outside = Tuple::new(a.ip(family), 40000, OUTSIDE.of(family), 80);
    let remote = Tuple::new(a.ip(family), 40000, REMOTE_POD.of(family), 8080);
    node.route_remote_cidrs();
    // The TCP flow's verdict is cached by its SYN.
    node.try_run(Hook::PodTc(a), &a.sends(flow.tcp(TCP_SYN)))
        .expect("SYN");
    let (proto, echo) = echo_request(a.ip(family), b.ip(family));
    let echo = a.sends(ip(a.ip(family), b.ip(family), TTL, proto, &echo));
    let echo_frame = echo.clone();
    let to_itself = Tuple::new(a.ip(family), 40000, a.ip(family), 8080);
    let cases: Vec<(&str, &Pod, Vec<u8>, u32)> = vec![
        (
            "icmp echo to a local pod (no flow lookup)",
            a,
            echo,
            TC_ACT_REDIRECT,
        ),
        (
            "udp to the sender itself",
            a,
            a.sends(to_itself.udp()),
            TC_NEXT,
        ),
        (
            "udp 64 B to a local pod",
            a,
            a.sends(flow.udp()),
            TC_ACT_REDIRECT,
        ),
        (
            "tcp ACK to a local pod",
            a,
            a.sends(flow.tcp(TCP_ACK)),
            TC_ACT_REDIRECT,
        ),
        (
            "tcp SYN to a local pod",
            a,
            a.sends(flow.tcp(TCP_SYN)),
            TC_ACT_REDIRECT,
        ),
        (
            "udp reply of a translated flow",
            b,
            b.sends(translated_reply.udp()),
            TC_NEXT,
        ),
        (
            "udp to outside the cluster",
            a,
            a.sends(outside.udp()),
            TC_NEXT,
        ),
        // To another node's pod: the flow's verdict and the remote CIDR's
        // lookup. test_run's repeats share one frame, so the TTL each
        // forwarded run takes off has run out after 63 runs: what is timed
        // is the decision, the stack taking the expiring packet (the FIB
        // and the redirect are not in the figure).
        (
            "udp to another node's pod, TTL run out (the decision, no FIB)",
            a,
            a.sends(remote.udp()),
            TC_NEXT,
        ),
        // A continuing segment to an address that is no pod's: asked
        // whether it is another node's (`PEER_NODES_*`), then the stack's.
        (
            "tcp ACK to outside the cluster",
            a,
            a.sends(outside.tcp(TCP_ACK)),
            TC_NEXT,
        ),
    ];
    let mut lines = Vec::new();
    // What the stack's delivery into a pod costs: `to_pod` takes back a
    // kept "clear" of the flow, reads the pod's policy state, hands it on.
    let delivery = (
        "to_pod: the stack delivers a datagram into a pod",
        PROG_TO_POD,
        b,
        a.sends(flow.udp()),
        TC_NEXT,
    );
    // The floor: what a run costs the harness (test_run's loop, the
    // program's call and return) with next to nothing done in it.
    let floor = (
        "floor: to_uplink on a packet not UDP (test_run's own cost per run)",
        PROG_TO_UPLINK,
        a,
        echo_frame.clone(),
        TC_NEXT,
    );
    let timed = [floor, delivery].into_iter().chain(
        cases
            .into_iter()
            .map(|(case, pod, frame, verdict)| (case, PROG_FROM_POD, pod, frame, verdict)),
    );
    let mut time = |case: &str, program: &str, pod: &Pod, frame: &[u8], verdict: u32| {
        let path = node.scratch.program_path(program);
        let (got, per_run) = node
            .netns
            .run(|| time_tc(&path, frame, pod.host_ifindex, REPEAT))
            .expect(case);
        assert_eq!(got, verdict, "{case}: verdict");
        let line =
            serde_json::json!({"program": program, "case": case, "ns": per_run.as_nanos() as u64});
        println!("{line}");
        lines.push(line.to_string());
    };
    for (case, program, pod, frame, verdict) in timed {
        time(case, program, pod, &frame, verdict);
    }
    // NetworkPolicy: A's egress allows TCP 8080 to the pod subnet by
    // prefix and TCP 9090 to identity 7 (B, once named). A recorded flow
    // is what most packets of an isolated pod cost; a denied packet is
    // judged every time, so its runs time the judgement: the prefix alone
    // (B has no identity), then with B's identity and its entry looked up.
    let prefixes = [
        policy::rule("10.244.0.0/16", &[policy::tcp_port(8080)]),
        policy::rule("fd00:244::/32", &[policy::tcp_port(8080)]),
    ];
    let peers = [PeerRule {
        identity: 7,
        ports: PolicyPorts::Ranges(vec![policy::tcp_port(9090)]),
    }];
    let table = PolicyTable {
        rules: &prefixes,
        peers: &peers,
    };
    node.set_tables(a, None, Some(table));
    let recorded = Tuple::new(a.ip(family), 40020, b.ip(family), 8080);
    node.try_run(Hook::PodTc(a), &a.sends(recorded.tcp(TCP_SYN)))
        .expect("the recorded flow's SYN");
    let denied = a.sends(Tuple::new(a.ip(family), 40021, b.ip(family), 7000).udp());
    time(
        "policy: tcp ACK of a flow A's egress policy recorded",
        PROG_FROM_POD,
        a,
        &a.sends(recorded.tcp(TCP_ACK)),
        TC_ACT_REDIRECT,
    );
    time(
        "policy: udp A's egress denies, judged by prefix (the peer has no identity)",
        PROG_FROM_POD,
        a,
        &denied,
        TC_ACT_SHOT,
    );
    node.name_pod(b, 7);
    time(
        "policy: udp A's egress denies, judged by prefix and by the peer's identity",
        PROG_FROM_POD,
        a,
        &denied,
        TC_ACT_SHOT,
    );
    node.scratch
        .datapath
        .clear_pod_policy(a.slot)
        .expect("A's policy cleared");
    // The same frame while a NodePort listens for clients outside: only
    // then does `from_pod` ask the reply path (a tail call, a parse, a
    // `NAT_REVERSE` lookup) before the stack.
    node.scratch
        .datapath
        .set_external_port(external_port::ANY_PORT, external_port::NODEPORT_TCP)
        .expect("a NodePort listening");
    time(
        "udp to outside the cluster, a NodePort listening",
        PROG_FROM_POD,
        a,
        &a.sends(outside.udp()),
        TC_NEXT,
    );
    time(
        "udp to another node's pod, TTL run out, a NodePort listening",
        PROG_FROM_POD,
        a,
        &a.sends(remote.udp()),
        TC_NEXT,
    );
    if let Ok(out) = std::env::var("FLATNET_PROGRAM_COST") {
        std::fs::write(out, lines.join("\n") + "\n").expect("writing the costs");
    }
}

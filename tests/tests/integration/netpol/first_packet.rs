//! A new pod is held to its policies from its first packet: the agent writes
//! them before ADD answers.

use super::*;
use flatnet_harness::RecvThroughSignals;

/// A pod's own UDP probes of one server from the instant its namespace
/// exists (before ADD gave it an interface): how many were sent, and how
/// many answered.
struct FirstPacketProber {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl FirstPacketProber {
    fn start(netns: PathBuf, to: Ipv4Addr, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent, answered) = (stop.clone(), sent.clone(), answered.clone());
            std::thread::spawn(move || {
                enter_thread(&netns).expect("enter the pod's netns");
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    // A new socket each time: the route may appear any moment.
                    let Ok(socket) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) else {
                        continue;
                    };
                    let _ = socket.set_read_timeout(Some(Duration::from_millis(20)));
                    if socket.send_to(b"probe", (to, port)).is_err() {
                        // No interface or route yet: ADD has not run; try
                        // again at once (the first packet is the point).
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    if socket.recv_through_signals(&mut buf).is_ok() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        FirstPacketProber {
            stop,
            sent,
            answered,
            thread: Some(thread),
        }
    }

    /// (sent, answered) so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.answered.load(Ordering::Relaxed),
        )
    }
}

impl Drop for FirstPacketProber {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Upstream e2e's failing shape, kept: a pod created after a policy that
/// denies its egress, probing from its very first instant, must never get
/// an answer, though kubelet reports its address seconds later. ADD starts
/// it isolated as its namespace's policies are (`isolation-<net>.json`),
/// and records who it is for the agent, which writes its real policy (or
/// opens it) at once. Also: a namespace without policies starts open, a
/// pod its namespace's policies do not select is opened within moments,
/// and with the agent down a new pod stays isolated until it is back.
#[flatnet_test(root)]
fn a_new_pod_is_held_to_its_policies_from_its_first_packet() {
    let cluster = cluster();
    let stub = ApiStub::from_fixture();
    for namespace in NAMESPACES {
        stub.add(Kind::Namespace, model_namespace(namespace));
    }
    let served = cluster.start_agents_on_api(&stub);
    let n1 = &cluster.nodes[0];
    let node_name = n1.spec.name.as_str();
    let server = n1.pod();
    let mut servers = Servers::default();
    servers.udp(server.netns.path(), 80, "y/server".into());
    servers.tcp(server.netns.path(), 80, "y/server".into());
    stub.add(Kind::Pod, pending_pod("y", "server", node_name));
    report_ip(&stub, "y", "server", server.ip);
    // x: every pod's egress denied; z: only pod a's ingress isolated.
    stub.add(Kind::NetworkPolicy, deny_all_egress("x"));
    stub.add(
        Kind::NetworkPolicy,
        policy(
            "z",
            "a-ingress",
            json!({"podSelector": only("a"), "policyTypes": ["Ingress"]}),
        ),
    );
    use flatnet_datapath::node::first_packet::{Directions, Isolation};
    wait_until(
        "the agent to write the namespaces' isolation",
        SETTLE,
        || {
            Isolation::read(&n1.network).is_some_and(|i| {
                i.listed
                    && i.namespaces.get("x")
                        == Some(&Directions {
                            ingress: false,
                            egress: true,
                        })
                    && i.namespaces.get("z")
                        == Some(&Directions {
                            ingress: true,
                            egress: false,
                        })
                    && !i.namespaces.contains_key("y")
            })
        },
    );

    // x/c: in the API before its sandbox, probing from its first instant.
    stub.add(Kind::Pod, pending_pod("x", "c", node_name));
    let netns = Netns::new();
    let prober = FirstPacketProber::start(netns.path(), server.ip, 80);
    let c = n1.pod_in(netns, &kubelet_args("x", "c"));
    assert_eq!(
        policy_flags(n1, c.ip) & flatnet_common::POLICY_F_EGRESS,
        flatnet_common::POLICY_F_EGRESS,
        "isolated for egress when ADD returned"
    );
    // kubelet reports the address once the containers run: seconds later.
    std::thread::sleep(Duration::from_secs(2));
    report_ip(&stub, "x", "c", c.ip);
    // And probes go on for a second after it: none may get through then either.
    std::thread::sleep(Duration::from_secs(1));
    let (sent, answered) = prober.counts();
    drop(prober);
    eprintln!("x/c from its first instant: {sent} probes sent, {answered} answered");
    assert!(sent > 50, "the prober hardly ran: {sent}");
    assert_eq!(
        answered, 0,
        "a probe got through before or after its policy"
    );
    // The egress denial is the agent's by now, not just ADD's start.
    assert_eq!(
        probe(&c.netns.path(), server.ip, 80, Proto::Tcp, "y/server"),
        Outcome::Denied
    );

    // y/d: no policy in its namespace: open from the start.
    stub.add(Kind::Pod, pending_pod("y", "d", node_name));
    let d = n1.pod_in(Netns::new(), &kubelet_args("y", "d"));
    assert_eq!(policy_flags(n1, d.ip), 0, "y has no policies");
    assert_eq!(
        probe(&d.netns.path(), server.ip, 80, Proto::Udp, "y/server"),
        Outcome::Allowed
    );

    // z/c: z's policy selects pod a only. z/c starts isolated for ingress
    // and is opened once the agent saw its record: no IP in the API yet.
    stub.add(Kind::Pod, pending_pod("z", "c", node_name));
    let zc = n1.pod_in(Netns::new(), &kubelet_args("z", "c"));
    servers.udp(zc.netns.path(), 80, "z/c".into());
    let started = Instant::now();
    let opened = poll_until(SETTLE, POLL_INTERVAL, || {
        probe_once(&server.netns.path(), zc.ip, 80, Proto::Udp, "z/c") == Outcome::Allowed
    });
    assert!(
        opened,
        "z/c, selected by no policy, was not opened:\n{}",
        n1.agent_log()
    );
    eprintln!("z/c opened {:?} after its ADD", started.elapsed());
    assert_eq!(policy_flags(n1, zc.ip), 0);

    // The agent down: a new pod of x starts isolated and stays so.
    n1.stop_agent();
    stub.add(Kind::Pod, pending_pod("x", "e", node_name));
    let e = n1.pod_in(Netns::new(), &kubelet_args("x", "e"));
    assert_eq!(
        probe(&e.netns.path(), server.ip, 80, Proto::Udp, "y/server"),
        Outcome::Denied,
        "with the agent down"
    );
    // Back, it follows the API: x's policy deleted, x/e is opened.
    n1.start_agent(&Peers::Api(served[0].url.clone()));
    n1.wait_ready();
    stub.delete(Kind::NetworkPolicy, "x/deny-egress");
    wait_until("x/e to be opened once its policy is gone", SETTLE, || {
        probe_once(&e.netns.path(), server.ip, 80, Proto::Udp, "y/server") == Outcome::Allowed
    });
    let errors = metric(&n1.metrics(), "flatnet_policy_errors_total").unwrap_or(0.0);
    assert_eq!(errors, 0.0, "{}", n1.agent_log());
}

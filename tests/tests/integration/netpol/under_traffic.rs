//! Policies that change while traffic flows: probes and live streams across
//! each change follow the model.

use super::*;

/// Probes `pairs` (from, to) on TCP 80 over and over on threads until
/// stopped; each result with when its probe began.
struct ProbeLoop {
    stop: Arc<AtomicBool>,
    results: Arc<Mutex<Vec<(Instant, String, Outcome)>>>,
    threads: Vec<JoinHandle<()>>,
}

impl ProbeLoop {
    fn start(world: &World, pairs: &[(&str, &str)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let results = Arc::new(Mutex::new(Vec::new()));
        let threads = pairs
            .iter()
            .map(|(from, to)| {
                let (stop, results) = (stop.clone(), results.clone());
                let netns = world.pod(from).netns();
                let (ip, expect) = (world.pod(to).ip, to.to_string());
                let pair = format!("{from}->{to}");
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        let outcome = probe_once(&netns, ip, 80, Proto::Tcp, &expect);
                        results.lock().unwrap().push((began, pair.clone(), outcome));
                        // The probe interval: the timeline's resolution.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            })
            .collect();
        ProbeLoop {
            stop,
            results,
            threads,
        }
    }

    fn stop(mut self) -> Vec<(Instant, String, Outcome)> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread.join().unwrap();
        }
        std::mem::take(&mut *self.results.lock().unwrap())
    }
}

/// What the loop saw of `pair` in probes begun in [from, to).
fn seen(
    results: &[(Instant, String, Outcome)],
    pair: &str,
    from: Instant,
    to: Instant,
) -> Vec<Outcome> {
    results
        .iter()
        .filter(|(began, p, _)| p == pair && *began >= from && *began < to)
        .map(|(_, _, o)| o.clone())
        .collect()
}

/// A paced TCP stream from `client` to a server on port 82 of `server`,
/// counting what arrives.
struct Stream {
    received: Arc<AtomicU64>,
    /// The server's end of the connection, once accepted: its kernel
    /// counters say what passed the datapath, whenever the reader reads.
    accepted: Arc<std::sync::OnceLock<TcpStream>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Stream {
    fn start(server: &ModelPod, client: &ModelPod) -> Self {
        let (received, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let listener = server
            .sim
            .netns
            .run(|| TcpListener::bind((server.ip, 0)).unwrap());
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::OnceLock::new());
        let receiver = {
            let (received, stop, accepted) = (received.clone(), stop.clone(), accepted.clone());
            std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let _ = accepted.set(conn.try_clone().unwrap());
                conn.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    match conn.read_through_signals(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            received.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                        Err(_) => return,
                    }
                }
            })
        };
        let client_ns = client.netns();
        let sender = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                enter_thread(&client_ns).unwrap();
                let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
                conn.set_write_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let chunk = vec![7u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    match conn.write(&chunk) {
                        Ok(_) => {}
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                        Err(_) => return,
                    }
                    // Paced: a steady trickle, not a flood of the test's CPU.
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Stream {
            received,
            accepted,
            stop,
            threads: vec![receiver, sender],
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Bytes that arrived in `window`.
    fn flow(&self, window: Duration) -> u64 {
        let before = self.received();
        std::thread::sleep(window);
        self.received() - before
    }

    /// Bytes that reached the server's socket in `window`, read or not:
    /// what got past the datapath then. What the reader counts lags it on
    /// a loaded machine (a starved reader once read 2.6 MB of its buffer
    /// after a deny).
    fn delivered(&self, window: Duration) -> u64 {
        let conn = self.accepted.get().expect("the stream's connection");
        let before = bytes_received(conn);
        std::thread::sleep(window);
        bytes_received(conn) - before
    }
}

/// The kernel's count of bytes received on `conn` (`tcpi_bytes_received`
/// of TCP_INFO, Linux 4.1 and later).
fn bytes_received(conn: &TcpStream) -> u64 {
    use std::os::fd::AsRawFd;
    // struct tcp_info up to tcpi_bytes_received (offset 128).
    const OFFSET: usize = 128;
    let mut info = [0u8; OFFSET + 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: the buffer and its length are valid for the call.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    assert!(len as usize >= info.len(), "TCP_INFO is {len} bytes");
    u64::from_ne_bytes(info[OFFSET..].try_into().unwrap())
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[flatnet_test(root)]
fn policy_changes_under_traffic_follow_the_model() {
    let cluster = cluster();
    let world = World::new(&cluster);

    // A policy updated, then deleted, while probes run: x/a from y only,
    // then from z only, then no policy. y/b is on x/a's node, z/b not.
    let from_ns = |ns: &str| {
        policy(
            "x",
            "a-from",
            json!({"podSelector": only("a"),
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": ns}}}]}]}),
        )
    };
    world.policy(from_ns("y"));
    world.check("x/a from y", true);
    let (from_y, from_z) = ("y/b->x/a", "z/b->x/a");
    let looping = Instant::now();
    let probes = ProbeLoop::start(&world, &[("y/b", "x/a"), ("z/b", "x/a")]);
    // Fixed phases of a timeline (before, after the add, after the delete):
    // each must hold long enough for the probes to show its state.
    std::thread::sleep(Duration::from_millis(700));
    let changed = Instant::now();
    world.apply(|stub| stub.add(Kind::NetworkPolicy, from_ns("z")));
    let written = Instant::now();
    std::thread::sleep(Duration::from_millis(1200));
    let deleting = Instant::now();
    world.apply(|stub| stub.delete(Kind::NetworkPolicy, "x/a-from"));
    let deleted = Instant::now();
    std::thread::sleep(Duration::from_millis(1200));
    let end = Instant::now();
    let results = probes.stop();
    let phases = [
        ("before the update", looping, changed, true, false),
        (
            "after the update was written",
            written,
            deleting,
            false,
            true,
        ),
        ("after the delete was written", deleted, end, true, true),
    ];
    for (phase, from, to, y_allowed, z_allowed) in phases {
        for (pair, allowed) in [(from_y, y_allowed), (from_z, z_allowed)] {
            let outcomes = seen(&results, pair, from, to);
            let want = if allowed {
                Outcome::Allowed
            } else {
                Outcome::Denied
            };
            assert!(
                !outcomes.is_empty() && outcomes.iter().all(|o| *o == want),
                "{pair} {phase}: want {want:?}, saw {outcomes:?}"
            );
        }
    }
    eprintln!("probe loop: {} probes", results.len());
    world.check("x/a from y, then z, then deleted", false);

    // A pod relabelled: x/a admits pods labelled b of any namespace; y/c
    // becomes one, then is restored.
    world.policy(policy(
        "x",
        "a-from-b",
        json!({"podSelector": only("a"),
               "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": only("b")}]}]}),
    ));
    let yc = world.pod("y/c");
    let allowed_yc = |world: &World| model(&world.stub, &world.ids, 80, Proto::Tcp)[5][0];
    assert_eq!(world.ids[5], "y/c");
    assert!(!allowed_yc(&world));
    assert_eq!(
        probe(&yc.netns(), world.pod("x/a").ip, 80, Proto::Tcp, "x/a"),
        Outcome::Denied
    );
    world.check("x/a from pods b", true);
    world.apply(|stub| {
        stub.modify(Kind::Pod, "y/c", |p| {
            p["metadata"]["labels"]["pod"] = json!("b");
        })
    });
    assert!(allowed_yc(&world), "the model follows the relabel");
    world.check("y/c relabelled pod=b", true);
    world.apply(|stub| {
        stub.modify(Kind::Pod, "y/c", |p| {
            p["metadata"]["labels"]["pod"] = json!("c");
        })
    });
    world.check("y/c labelled back", true);
    world.clear_policies();

    // A namespace relabelled: y admits namespaces labelled ns=x; z takes
    // that label, then gives it back.
    world.policy(policy(
        "y",
        "from-ns-x",
        json!({"podSelector": {},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}]}),
    ));
    world.check("y from ns=x", true);
    world.apply(|stub| {
        stub.modify(Kind::Namespace, "z", |n| {
            n["metadata"]["labels"]["ns"] = json!("x");
        })
    });
    assert!(
        model(&world.stub, &world.ids, 81, Proto::Udp)[6][3],
        "z/a -> y/a"
    );
    world.check("namespace z relabelled ns=x", true);
    world.apply(|stub| {
        stub.modify(Kind::Namespace, "z", |n| {
            n["metadata"]["labels"]["ns"] = json!("z");
        })
    });
    world.check("namespace z labelled back", true);
    world.clear_policies();

    // Established streams into x/a (from y/b on its node, from y/a on the
    // other) when an ingress policy arrives: one that still allows them
    // leaves them alone; then a deny cuts them at their next packet (the
    // datapath judges a flow again once the pod's generation moved).
    let xa = world.pod("x/a");
    let streams = [
        Stream::start(xa, world.pod("y/b")),
        Stream::start(xa, world.pod("y/a")),
    ];
    assert_eq!(world.pod("y/b").node, xa.node);
    assert_ne!(world.pod("y/a").node, xa.node);
    let window = Duration::from_millis(500);
    for stream in &streams {
        wait_until("the stream to flow", SETTLE, || stream.received() > 0);
    }
    world.policy(policy(
        "x",
        "a-from-y",
        json!({"podSelector": only("a"),
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    ));
    for stream in &streams {
        assert!(
            stream.flow(window) > 0,
            "an ingress policy that allows the stream stopped it"
        );
    }
    let node = world.node_of("x/a");
    let slot = node
        .datapath()
        .slot_of(IpAddr::V4(xa.ip))
        .unwrap()
        .expect("x/a's slot");
    let drops_before = node.datapath().policy_drops(slot).unwrap().0;
    let generation = node.datapath().pod_policy(slot).unwrap().generation;
    world.policy(policy(
        "x",
        "a-from-y",
        json!({"podSelector": only("a"), "policyTypes": ["Ingress"]}),
    ));
    // The agent's write landed (a new generation of x/a's policy: under
    // CI's load that once took longer than a fixed wait); what was in
    // flight then may still arrive.
    wait_until("x/a's new policy in its maps", SETTLE, || {
        node.datapath().pod_policy(slot).unwrap().generation != generation
    });
    std::thread::sleep(Duration::from_millis(300));
    for (stream, from) in streams.iter().zip(["y/b", "y/a"]) {
        let flowed = stream.delivered(Duration::from_millis(1500));
        let datapath = node.datapath();
        assert_eq!(
            flowed,
            0,
            "the established stream from {from} still flows after x/a's ingress was denied \
             ({flowed} bytes reached x/a's socket in 1.5 s; x/a's ingress drops {} -> {}; \
             its policy {:?}, rules {:?}, peer rules {:?})\n{}",
            drops_before,
            datapath.policy_drops(slot).unwrap().0,
            datapath.pod_policy(slot).unwrap(),
            datapath.pod_policy_rules(slot).unwrap(),
            datapath.pod_policy_peers(slot).unwrap(),
            world.logs()
        );
    }
    let drops = node.datapath().policy_drops(slot).unwrap().0;
    assert!(
        drops > drops_before,
        "x/a's ingress drops did not grow: {drops_before} -> {drops}"
    );
    drop(streams);
    world.check("x/a denies all ingress", true);
    world.clear_policies();
    world.check("all policies gone", false);
}

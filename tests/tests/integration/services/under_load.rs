//! Services under load: streams across a datapath upgrade, many DNS-like
//! clients at once, pod-to-pod traffic that keeps the fast path.

use super::*;

/// Streams paced data to `to` for `duration` while reading the echo back
/// (data both ways on one connection); runs `during` in the middle. Returns
/// (bytes sent, bytes echoed back). A reset or a stall fails.
pub(crate) fn echo_stream_during(
    client: &Netns,
    to: SocketAddr,
    duration: Duration,
    during: impl FnOnce(),
) -> (u64, u64) {
    let conn = client
        .run(|| TcpStream::connect_timeout(&to, IO_TIMEOUT))
        .unwrap_or_else(|e| panic!("connect {to}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = conn.try_clone().unwrap();
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        let mut banner_done = false;
        loop {
            match reader.read_through_signals(&mut buf) {
                Ok(0) => return total,
                Ok(n) => {
                    let mut data = &buf[..n];
                    if !banner_done {
                        match data.iter().position(|b| *b == b'\n') {
                            Some(at) => {
                                banner_done = true;
                                data = &data[at + 1..];
                            }
                            None => continue,
                        }
                    }
                    total += data.len() as u64;
                }
                Err(e) => panic!("receiving the echo: {e} after {total} bytes"),
            }
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        let mut writer = conn.try_clone().unwrap();
        std::thread::spawn(move || {
            writer
                .set_write_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let chunk = vec![3u8; 8 * 1024];
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = writer.write_all(&chunk) {
                    panic!("sending: {e} after {sent} bytes");
                }
                sent += chunk.len() as u64;
                // Paced: a stream that lasts the whole window.
                std::thread::sleep(Duration::from_millis(1));
            }
            writer.shutdown(std::net::Shutdown::Write).unwrap();
            sent
        })
    };
    let started = Instant::now();
    // The change lands a third into the stream, which then runs its course:
    // fixed windows are what the test is about.
    std::thread::sleep(duration / 3);
    during();
    if let Some(left) = duration.checked_sub(started.elapsed()) {
        std::thread::sleep(left);
    }
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender");
    let echoed = receiver.join().expect("receiver");
    (sent, echoed)
}

/// IDs of the node's pinned from_pod and from_uplink.
/// Makes the pinned programs look like an older build's: the next ADD
/// loads this build's and moves every veth over, as a plugin upgrade does.
pub(crate) fn age_pinned_programs(datapath: &flatnet_datapath::bpf::Datapath) {
    for name in [
        flatnet_common::PROG_FROM_POD,
        flatnet_common::PROG_FROM_UPLINK,
    ] {
        let pinned = datapath.program_path(name);
        let older = pinned.with_file_name(format!("{name}-000000000000"));
        std::fs::rename(&pinned, &older).expect("age the pinned program");
    }
}

pub(crate) fn program_ids(node: &SimNode) -> Vec<u32> {
    let datapath = node.datapath();
    [
        flatnet_common::PROG_FROM_POD,
        flatnet_common::PROG_FROM_UPLINK,
    ]
    .iter()
    .map(|name| {
        datapath
            .program(name)
            .and_then(|p| p.id())
            .expect("pinned program")
    })
    .collect()
}

/// Two TCP streams through ClusterIPs, one to a backend on the client's
/// node (every reply a translated flow `from_pod` must hand to the stack),
/// one to a backend on the other node (replies `from_uplink` must hand to
/// the stack), while the client's node's datapath is upgraded (the pinned
/// programs are made to look like an older build's, and the next ADD loads
/// this build's and moves every veth over, as a plugin upgrade does) and
/// both nodes' agents restart. No reset, no byte lost either way.
#[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
fn streams_through_clusterips_survive_an_upgrade(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let (client, near, far) = (n1.pod(), n1.pod(), n2.pod());
    let _servers = [
        TcpBackend::start(&near, "near", BACKEND_PORT),
        TcpBackend::start(&far, "far", BACKEND_PORT),
    ];
    let mut list = Vec::new();
    for family in FAMILIES {
        for (n, backend) in [(10, &near), (11, &far)] {
            list.push(ServicePort::cluster_ip(
                &format!("web{n}-{family:?}").to_lowercase(),
                cluster_ip(family, n),
                80,
                Protocol::Tcp,
                vec![SocketAddr::new(pod_ip(backend, family), BACKEND_PORT)],
            ));
        }
    }
    services.program(&list);
    let peers = services.cluster.file();
    for family in FAMILIES {
        let before = program_ids(n1);
        let datapath = n1.datapath();
        let mut third = None;
        let ((sent, echoed), (sent_far, echoed_far)) = std::thread::scope(|scope| {
            let far_stream = scope.spawn(|| {
                echo_stream_during(
                    &client.netns,
                    SocketAddr::new(cluster_ip(family, 11), 80),
                    Duration::from_secs(10),
                    || {},
                )
            });
            let near_stream = echo_stream_during(
                &client.netns,
                SocketAddr::new(cluster_ip(family, 10), 80),
                Duration::from_secs(10),
                || {
                    age_pinned_programs(&datapath);
                    third = Some(n1.pod());
                    for node in [n1, n2] {
                        node.stop_agent();
                        node.start_agent(&peers);
                        node.wait_ready();
                    }
                },
            );
            (near_stream, far_stream.join().expect("far stream"))
        });
        for (what, sent, echoed) in [("near", sent, echoed), ("far", sent_far, echoed_far)] {
            assert_eq!(sent, echoed, "{mode:?} {family:?} {what}: bytes lost");
            assert!(
                sent > 1 << 20,
                "{mode:?} {family:?} {what}: the stream barely moved: {sent} bytes"
            );
        }
        let after = program_ids(n1);
        assert!(
            after.iter().zip(&before).all(|(a, b)| a != b),
            "{mode:?} {family:?}: no new programs were loaded ({before:?} -> {after:?})"
        );
        drop(third);
    }
}

const DNS_CLIENTS: usize = 20;

/// A DNS-like server pod behind ClusterIP:53 and 20 client pods (half on
/// its node, half on the other) querying at once: each gets the answer to
/// its own query, from the ClusterIP.
#[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
fn dns_like_clients_at_once(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let server = n1.pod();
    let _udp = UdpBackend::start(&server, "dns", DNS_PORT);
    let clients: Vec<SimPod> = (0..DNS_CLIENTS)
        .map(|i| if i % 2 == 0 { n1.pod() } else { n2.pod() })
        .collect();
    let list: Vec<ServicePort> = FAMILIES
        .iter()
        .map(|family| {
            ServicePort::cluster_ip(
                &format!("dns-{family:?}").to_lowercase(),
                cluster_ip(*family, 53),
                DNS_PORT,
                Protocol::Udp,
                vec![SocketAddr::new(pod_ip(&server, *family), DNS_PORT)],
            )
        })
        .collect();
    services.program(&list);
    for family in FAMILIES {
        let to = SocketAddr::new(cluster_ip(family, 53), DNS_PORT);
        let barrier = std::sync::Barrier::new(DNS_CLIENTS);
        let answers: Vec<anyhow::Result<String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = clients
                .iter()
                .enumerate()
                .map(|(i, client)| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        udp_query(client, to, &format!("query-{i}.{family:?}.example"))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("client"))
                .collect()
        });
        for (i, answer) in answers.into_iter().enumerate() {
            let name = answer.unwrap_or_else(|e| panic!("{mode:?} {family:?} client {i}: {e}"));
            assert_eq!(name, "dns");
        }
    }
}

/// With Services in place and in use, direct pod-to-pod traffic still
/// takes the redirect (same node) and the fast path out (other node), and
/// the node's stack forwards next to nothing of it.
#[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
fn pod_to_pod_keeps_the_fast_path_next_to_services(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let (a, b, c) = (n1.pod(), n1.pod(), n2.pod());
    let _servers: Vec<TcpBackend> = [(&b, "b"), (&c, "c")]
        .into_iter()
        .map(|(pod, name)| TcpBackend::start(pod, name, BACKEND_PORT))
        .collect();
    let list: Vec<ServicePort> = web_in_both_families(&[&b, &c])
        .into_iter()
        .map(|service| service.with_node_port(NODE_PORT))
        .collect();
    services.program(&list);
    for family in FAMILIES {
        // The Services in use first: conntrack holds their flows.
        for _ in 0..10 {
            tcp_request(&a, SocketAddr::new(cluster_ip(family, 10), 80), 1024)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} ClusterIP: {e}"));
        }
        const LEN: usize = 4 << 20;
        let redirected = n1.bytes(action::REDIRECTED);
        let forwarded = n1.forwarded();
        let name = tcp_request(&a, SocketAddr::new(pod_ip(&b, family), BACKEND_PORT), LEN)
            .unwrap_or_else(|e| panic!("{mode:?} {family:?} a -> b: {e}"));
        assert_eq!(name, "b");
        let redirected = n1.bytes(action::REDIRECTED) - redirected;
        // 4 MiB each way, redirected by n1 both ways.
        assert!(
            redirected > 2 * LEN as u64,
            "{mode:?} {family:?}: only {redirected} bytes redirected"
        );
        let out = n1.bytes(action::TO_REMOTE_NODE);
        let name = tcp_request(&a, SocketAddr::new(pod_ip(&c, family), BACKEND_PORT), LEN)
            .unwrap_or_else(|e| panic!("{mode:?} {family:?} a -> c: {e}"));
        assert_eq!(name, "c");
        let out = n1.bytes(action::TO_REMOTE_NODE) - out;
        assert!(
            out > LEN as u64 * 49 / 50,
            "{mode:?} {family:?}: only {out} bytes to n2"
        );
        if family == Family::V4 {
            // ForwDatagrams is IPv4's counter: segments of 8 MiB each way
            // and their ACKs, of which the stack routed (nearly) none.
            let forwarded = n1.forwarded() - forwarded;
            assert!(
                forwarded < 50,
                "{mode:?}: n1's stack forwarded {forwarded} datagrams"
            );
        }
    }
}

//! The move of a pod's programs from cls_bpf filters to tcx links (ADD's
//! work after its answer, an upgrade's re-attach, `flatnet repair`) while
//! the host stack sends into the pod: nothing it sends is lost.
//!
//! Found as one lost UDP datagram in the IPv6 NodePort test under load:
//! the backend's node forwards a NodePort's UDP from the other node through
//! its stack into the pod (the fast path takes only TCP from a node), and
//! ADD's move, run late by the loaded machine, deleted the veth's clsact
//! qdisc then. Deleting a qdisc (clsact too) deactivates the device: its
//! transmit queue is the noop qdisc until it is active again, and the
//! kernel dropped the datagram there (`kfree_skb` reason `QDISC_DROP` in
//! `__dev_queue_xmit` after `ip6_forward`, the node counting the datagram
//! forwarded and the pod never receiving it). The fast path's redirects
//! never meet that queue, which is why the TCP stream of
//! `tcx::a_node_attached_with_filters_moves_to_tcx_under_a_live_stream`
//! did not see it.

use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flatnet_datapath::bpf::ATTACH_ENV;
use flatnet_tests::*;

const PORT: u16 = 5353;
/// The sender's pace: a datagram every this long, so the receiver keeps up
/// (nothing lost to its buffer) and the move meets many of them.
const GAP: Duration = Duration::from_micros(50);

/// A pod attached the old way (cls_bpf filters on a clsact qdisc), which is
/// also where ADD leaves a new pod before its work after the answer.
fn pod_with_filters(net: &Network) -> Pod<'_> {
    let netns = Netns::new();
    let id = unique("ctr-");
    let mut call = CniCall::new("ADD", &id, &netns.path(), "eth0");
    call.env.push((ATTACH_ENV.into(), "netlink".into()));
    let out = call.run(&bin("flatnet"), &net.stdin());
    assert!(out.success(), "ADD the old way: {out:?}");
    Pod {
        network: net,
        netns,
        container_id: id,
        ifname: "eth0".into(),
        result: out.json(),
    }
}

/// Datagrams received by a UDP socket in `netns` until `stop`, counted.
fn count_datagrams(netns: &Netns, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let socket = netns.run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, PORT)).expect("bind"));
    // Room for everything a descheduled receiver may find queued: a loss
    // here is the buffer's, not the move's (RcvbufErrors would say so).
    let size: libc::c_int = 16 << 20;
    // SAFETY: a valid socket and an int option of the size given.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_RCVBUFFORCE");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::thread::spawn(move || {
        let mut received = 0;
        let mut buf = [0u8; 64];
        loop {
            match socket.recv_through_signals(&mut buf) {
                Ok(_) => received += 1,
                Err(_) if stop.load(Ordering::Relaxed) => return received,
                Err(_) => {}
            }
        }
    })
}

/// `netns`'s UDP receive errors (`nstat`): a full buffer's drops.
fn receive_buffer_errors(netns: &Netns) -> String {
    netns.exec(&["nstat", "-az", "UdpRcvbufErrors", "UdpInErrors"])
}

/// Three pods attached the old way, each sent UDP datagrams by the host
/// (through its stack, the route on the pod's host veth) the whole time
/// `flatnet repair` moves them onto tcx links: every datagram arrives.
/// Before the clsact qdisc stayed, each run lost some (the host veths'
/// transmit drops counting them).
#[flatnet_test(root, tools = ["nstat"])]
fn moving_to_tcx_drops_nothing_the_stack_sends_into_the_pod() {
    let net = Network::host_local();
    let pods: Vec<Pod> = (0..3).map(|_| pod_with_filters(&net)).collect();
    let stop_receivers = Arc::new(AtomicBool::new(false));
    let receivers: Vec<_> = pods
        .iter()
        .map(|pod| count_datagrams(&pod.netns, stop_receivers.clone()))
        .collect();
    let stop_senders = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = pods
        .iter()
        .map(|pod| {
            let (to, stop, sent) = (pod.ip(), stop_senders.clone(), sent.clone());
            std::thread::spawn(move || {
                let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
                socket.connect((to, PORT)).expect("connect");
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if socket.send(b"datagram").is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    next += GAP;
                    while Instant::now() < next {
                        std::hint::spin_loop();
                    }
                }
            })
        })
        .collect();
    // Under way before the move, and on for a while after it.
    wait_until("the streams to start", Duration::from_secs(5), || {
        sent.load(Ordering::Relaxed) > 1000
    });
    let conflist = std::env::temp_dir().join(format!("{}.conf", unique("tcx-move-")));
    std::fs::write(&conflist, net.conf.to_string()).expect("writing the config");
    let out = run_ok(
        Command::new(bin("flatnet"))
            .arg("repair")
            .arg("--conf")
            .arg(&conflist),
    );
    let _ = std::fs::remove_file(&conflist);
    assert!(out.contains("3 pod(s) attached"), "{out}");
    std::thread::sleep(Duration::from_millis(100));
    stop_senders.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.join().expect("a sender");
    }
    stop_receivers.store(true, Ordering::Relaxed);
    let received: u64 = receivers
        .into_iter()
        .map(|r| r.join().expect("a receiver"))
        .sum();
    let sent = sent.load(Ordering::Relaxed);
    let veths: Vec<String> = pods
        .iter()
        .map(|pod| run_ok(Command::new("ip").args(["-s", "link", "show", &pod.host_veth()])))
        .collect();
    let buffers: Vec<String> = pods
        .iter()
        .map(|pod| receive_buffer_errors(&pod.netns))
        .collect();
    assert_eq!(
        received,
        sent,
        "datagrams from the host lost across the move to tcx ({} of {sent})\n\
         host veths:\n{}\npods' receive buffers:\n{}",
        sent - received,
        veths.join(""),
        buffers.join("")
    );
    for pod in &pods {
        wait_for_tcx(&pod.host_veth());
    }
}

//! Packets with spoofed sources reach no pod, through Services or not.

use super::*;
use flatnet_harness::RecvThroughSignals;

/// Connects from `source` (an address the calling thread's namespace has)
/// to `to`; Err when nothing answers within `timeout`.
fn tcp_connect_from(source: SocketAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    let domain = socket2::Domain::for_address(to);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    socket.bind(&source.into())?;
    socket.connect_timeout(&to.into(), timeout)
}

/// A pod that gives itself another address (an unused one of its node's
/// CIDR, and another pod's) and sends from it, TCP SYNs and UDP, to a pod
/// on its node and a pod on the other node: nothing arrives, the drops are
/// counted, and its own address still works.
#[flatnet_test(root, cases(iptables(Mode::Iptables, &[]), nftables(Mode::Nftables, &[]), xdp(Mode::Iptables, &["--datapath", "xdp"])))]
fn spoofed_sources_reach_no_pod(mode: Mode, flags: &[&str]) {
    let services = ServiceCluster::flagged(mode, 2, flags);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let (spoofer, neighbour, local, remote) = (n1.pod(), n1.pod(), n1.pod(), n2.pod());
    services.program(&[]);
    for family in FAMILIES {
        let (unused, prefix) = match family {
            Family::V4 => ("10.244.1.200".parse::<IpAddr>().unwrap(), 24),
            Family::V6 => ("fd44:0:0:1::c8".parse::<IpAddr>().unwrap(), 64),
        };
        let stolen = pod_ip(&neighbour, family);
        for extra in [unused, stolen] {
            let mut add = vec!["ip", "addr", "add"];
            let cidr = format!("{extra}/{prefix}");
            add.extend([cidr.as_str(), "dev", "eth0"]);
            if family == Family::V6 {
                add.push("nodad");
            }
            spoofer.netns.exec(&add);
        }
        for target in [&local, &remote] {
            let to_ip = pod_ip(target, family);
            let listener = target
                .netns
                .run(|| TcpListener::bind((to_ip, 9000)))
                .expect("listen");
            listener.set_nonblocking(true).unwrap();
            let udp = target
                .netns
                .run(|| UdpSocket::bind((to_ip, 9001)))
                .expect("bind");
            udp.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            // The spoofer's own address works (and resolves the way there,
            // so what follows is the spoofed packets themselves).
            let own = SocketAddr::new(pod_ip(&spoofer, family), 0);
            spoofer
                .netns
                .run(|| tcp_connect_from(own, SocketAddr::new(to_ip, 9000), IO_TIMEOUT))
                .unwrap_or_else(|e| panic!("{mode:?} {family:?}: own address to {to_ip}: {e}"));
            drop(listener.accept().expect("the spoofer's own connection"));
            let dropped = n1.packets(action::DROPPED);
            // TCP from the unused address, UDP from the neighbour's.
            let syn = spoofer.netns.run(|| {
                tcp_connect_from(
                    SocketAddr::new(unused, 0),
                    SocketAddr::new(to_ip, 9000),
                    Duration::from_millis(1500),
                )
            });
            assert!(
                syn.is_err(),
                "{mode:?} {family:?}: a SYN from {unused} got an answer"
            );
            spoofer.netns.run(|| {
                let socket = UdpSocket::bind((stolen, 0)).expect("bind the stolen address");
                for _ in 0..3 {
                    socket.send_to(b"spoofed", (to_ip, 9001)).expect("send");
                }
            });
            let mut buf = [0u8; 64];
            assert!(
                udp.recv_from_through_signals(&mut buf).is_err(),
                "{mode:?} {family:?}: a datagram from {stolen} reached {to_ip}"
            );
            assert!(
                listener.accept().is_err(),
                "{mode:?} {family:?}: a connection from {unused} reached {to_ip}"
            );
            let counted = n1.packets(action::DROPPED) - dropped;
            // At least the first SYN, its retransmission and the three
            // datagrams.
            assert!(counted >= 5, "{mode:?} {family:?}: {counted} drops counted");
        }
    }
}

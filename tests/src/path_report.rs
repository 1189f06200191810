//! Where a datagram died: what each namespace on its path counted (IPv6,
//! UDP and ICMPv6 counters, neighbour entries) and what each simulated
//! node's datapath did (its `STATS` actions), for a test whose datagram
//! got no answer; and whether the answer was only late.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use flatnet_common::action;

use crate::cluster::SimNode;
use crate::{Netns, RecvThroughSignals};

/// How long a test's UDP request waits for its answer.
pub const UDP_ANSWER_WAIT: Duration = Duration::from_secs(2);
/// How much longer an unanswered request listens on, to tell a late
/// answer from a lost one (only to say so: the request has failed).
const LATE_WAIT: Duration = Duration::from_secs(8);

/// A UDP request that got no answer in time.
#[derive(Debug)]
pub struct Unanswered {
    /// What the receive said when the wait ran out.
    pub error: std::io::Error,
    /// The client's port (the flow's source port).
    pub client_port: u16,
    /// When a late answer came after the request was sent; None: none
    /// came in `UDP_ANSWER_WAIT` and `LATE_WAIT` together.
    pub late: Option<Duration>,
}

/// One UDP exchange from `netns` with `to` (a new socket, so a new flow):
/// the answer and where it came from, or what became of the request.
pub fn udp_exchange(netns: &Netns, to: SocketAddr) -> Result<(String, SocketAddr), Unanswered> {
    netns.run(|| {
        let socket = if to.is_ipv4() {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        } else {
            UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))
        }
        .expect("a client socket");
        let client_port = socket.local_addr().map_or(0, |a| a.port());
        socket.set_read_timeout(Some(UDP_ANSWER_WAIT)).unwrap();
        let sent = Instant::now();
        socket.send_to(b"request", to).expect("send a request");
        let mut buf = [0u8; 512];
        match socket.recv_from_through_signals(&mut buf) {
            Ok((len, from)) => Ok((String::from_utf8_lossy(&buf[..len]).into_owned(), from)),
            Err(error) => {
                socket.set_read_timeout(Some(LATE_WAIT)).unwrap();
                let late = socket
                    .recv_from_through_signals(&mut buf)
                    .ok()
                    .map(|_| sent.elapsed());
                Err(Unanswered {
                    error,
                    client_port,
                    late,
                })
            }
        }
    })
}

/// The IPv6, UDP and ICMPv6 counters of `netns` a lost datagram shows in.
pub fn ipv6_counters(netns: &Netns) -> String {
    netns.exec(&[
        "nstat",
        "-az",
        "Udp6InDatagrams",
        "Udp6OutDatagrams",
        "Udp6NoPorts",
        "Udp6InErrors",
        "Udp6RcvbufErrors",
        "Icmp6InDestUnreachs",
        "Icmp6OutDestUnreachs",
        "Icmp6InErrors",
        "Icmp6InCsumErrors",
        "Icmp6OutRateLimitHost",
        "Icmp6OutRateLimitGlobal",
        "Ip6InNoRoutes",
        "Ip6OutNoRoutes",
        "Ip6InDiscards",
        "Ip6OutDiscards",
        "Ip6InAddrErrors",
        "Ip6OutForwDatagrams",
    ])
}

/// `node`'s datapath actions that counted packets ("name=packets").
pub fn actions(node: &SimNode) -> Vec<String> {
    let all = node.datapath().stats().expect("STATS");
    action::NAMES
        .iter()
        .zip(all)
        .filter(|(_, s)| s.packets > 0)
        .map(|(name, s)| format!("{name}={}", s.packets))
        .collect()
}

/// What every namespace of `path` (named) counted and the neighbours it
/// holds, and every node's datapath actions: a report for a failure
/// message.
pub fn ipv6_path_report(path: &[(&str, &Netns)], nodes: &[&SimNode]) -> String {
    let mut report = String::new();
    for (name, netns) in path {
        report.push_str(&format!(
            "{name}:\n{}neighbours:\n{}",
            ipv6_counters(netns),
            netns.exec(&["ip", "-6", "neigh", "show"])
        ));
    }
    for node in nodes {
        report.push_str(&format!(
            "{} actions: {:?}\n",
            node.spec.name,
            actions(node)
        ));
    }
    report
}

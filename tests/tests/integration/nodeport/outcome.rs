//! What an outside client gets from a NodePort, gathered the same way
//! through flatnet's cluster and through kube-proxy's so that the
//! side-by-side tests can hold one against the other.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use flatnet_datapath::bpf::service_key;
use flatnet_tests::cluster::*;
use flatnet_tests::*;

use super::exchanges::{
    Echo, LATE_BY, LateUdp, large_datagram_echoed, learn_path_mtu, tcp_ask, udp_ask, udp_refused,
};
use super::fixture::{CLOSED_NODE_PORT, LATE_NODE_PORT, NODE_PORT, OUTSIDE, OUTSIDE6};

/// The family a side-by-side run reaches NodePorts over: which node
/// addresses, which client address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    V4,
    V6,
}

impl Family {
    fn node(self, node: &SimNode) -> std::net::IpAddr {
        match self {
            Family::V4 => node.spec.address().into(),
            Family::V6 => node.spec.address6().into(),
        }
    }

    fn outside(self) -> std::net::IpAddr {
        match self {
            Family::V4 => OUTSIDE.into(),
            Family::V6 => OUTSIDE6.into(),
        }
    }

    fn unspecified(self) -> std::net::IpAddr {
        match self {
            Family::V4 => Ipv4Addr::UNSPECIFIED.into(),
            Family::V6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
        }
    }
}

/// ICMP (or ICMPv6) destination unreachables the netns has received.
fn dest_unreachables_received(netns: &Netns, family: Family) -> u64 {
    let counter = match family {
        Family::V4 => "IcmpInDestUnreachs",
        Family::V6 => "Icmp6InDestUnreachs",
    };
    let shown = netns.exec(&["nstat", "-az", counter]);
    shown
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(counter)).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {counter} in {shown}"))
}

/// What an outside client gets from a NodePort (externalTrafficPolicy
/// Cluster, TCP and UDP, a backend on each node) through each node: the
/// backends that answer, who each says the client was, where UDP answers
/// come from, and whether a port that is no NodePort's is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Outcome {
    /// (node, protocol) -> the answers ("name source"), the sources
    /// written as what they are ("node", "gateway", "client" or the
    /// address).
    pub(super) answers: std::collections::BTreeMap<(String, &'static str), BTreeSet<String>>,
    udp_answers_from_the_node_port: bool,
    other_port_refused: bool,
    /// (node, protocol) -> whether every try of the Service whose
    /// backends listen on nothing was refused (TCP: the backend's reset;
    /// UDP: its ICMP port unreachable, translated back).
    closed_backends_refuse: std::collections::BTreeMap<(String, &'static str), bool>,
    /// Port unreachables the backends got for answers that came after
    /// their client's socket had closed (the client's kernel's error,
    /// translated back to the backend), of `LATE_TRIES` per node.
    late_answers_refused_at_the_backends: u64,
    /// node -> whether datagrams too large for one packet (fragmented by
    /// the client's kernel, and the echo by the backend's) were echoed
    /// whole, from the NodePort.
    large_datagrams_echoed: std::collections::BTreeMap<String, bool>,
    /// IPv6: node -> the path MTU the client learned toward its NodePort
    /// from a translated packet too big (none over IPv4).
    pub(super) learned_path_mtu: std::collections::BTreeMap<String, Option<u32>>,
}

/// Datagrams per node whose client leaves before the late answer.
const LATE_TRIES: u64 = 4;

pub(super) fn outcome(cluster: &Cluster, backends: [&Netns; 2], family: Family) -> Outcome {
    let outside = &cluster._switch;
    let mut answers = std::collections::BTreeMap::new();
    let mut udp_from_node_port = true;
    let mut refused = true;
    let mut closed_refuse = std::collections::BTreeMap::new();
    for node in [cluster.node("cp-1"), cluster.node("worker-1")] {
        let to = SocketAddr::new(family.node(node), NODE_PORT);
        let name_source = |answer: String| {
            let (name, source) = answer.split_once(' ').expect("name source");
            let source: std::net::IpAddr = source.parse().expect("source");
            let what = if source == family.node(node) {
                "node".to_string()
            } else if source == family.outside() {
                "client".to_string()
            } else if source.to_string().ends_with(".1") || source.to_string().ends_with("::1") {
                "gateway".to_string()
            } else {
                source.to_string()
            };
            format!("{name} {what}")
        };
        let tcp = (0..16)
            .map(|_| name_source(tcp_ask(outside, to).unwrap_or_else(|e| panic!("TCP {to}: {e}"))))
            .collect();
        let udp = (0..16)
            .map(|_| {
                let (answer, from) =
                    udp_ask(outside, to).unwrap_or_else(|e| panic!("UDP {to}: {e}"));
                udp_from_node_port &= from == to;
                name_source(answer)
            })
            .collect();
        answers.insert((node.spec.name.clone(), "tcp"), tcp);
        answers.insert((node.spec.name.clone(), "udp"), udp);
        let other = SocketAddr::new(family.node(node), NODE_PORT + 1);
        refused &= tcp_ask(outside, other)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        let closed = SocketAddr::new(family.node(node), CLOSED_NODE_PORT);
        // Eight tries each: both backends are asked.
        closed_refuse.insert(
            (node.spec.name.clone(), "tcp"),
            (0..8).all(|_| {
                tcp_ask(outside, closed)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            }),
        );
        closed_refuse.insert(
            (node.spec.name.clone(), "udp"),
            (0..8).all(|_| udp_refused(outside, closed)),
        );
    }
    let unreachables = || -> u64 {
        backends
            .iter()
            .map(|b| dest_unreachables_received(b, family))
            .sum()
    };
    let before = unreachables();
    for node in [cluster.node("cp-1"), cluster.node("worker-1")] {
        let late = SocketAddr::new(family.node(node), LATE_NODE_PORT);
        for _ in 0..LATE_TRIES {
            // Sent, and the socket closed at once.
            outside.run(|| {
                UdpSocket::bind((family.unspecified(), 0))
                    .and_then(|socket| socket.send_to(b"late", late))
                    .expect("UDP to the late NodePort")
            });
            std::thread::sleep(LATE_BY * 2);
        }
    }
    let late_refused = unreachables() - before;
    let mut learned_path_mtu = std::collections::BTreeMap::new();
    let large = [cluster.node("cp-1"), cluster.node("worker-1")]
        .iter()
        .map(|node| {
            let to = SocketAddr::new(family.node(node), LATE_NODE_PORT);
            if family == Family::V6 {
                learned_path_mtu.insert(node.spec.name.clone(), learn_path_mtu(outside, to));
            }
            // Four tries: both backends are asked.
            let echoed = (0..4).all(|_| large_datagram_echoed(outside, to));
            (node.spec.name.clone(), echoed)
        })
        .collect();
    Outcome {
        answers,
        udp_answers_from_the_node_port: udp_from_node_port,
        other_port_refused: refused,
        closed_backends_refuse: closed_refuse,
        late_answers_refused_at_the_backends: late_refused,
        large_datagrams_echoed: large,
        learned_path_mtu,
    }
}

/// The side-by-side tests' servers in both clusters' backend pods (a
/// late UDP answerer and the echo servers), with `family`'s ICMP rate
/// limit off in the pods and the client: a kernel sends a peer at most
/// six errors at once and one per second after, and the closed and late
/// Services' checks make many.
pub(super) fn serve_side_by_side(
    clusters: [&Cluster; 2],
    pods: &[(SimPod, SimPod)],
    family: Family,
) -> (Vec<LateUdp>, Vec<Echo>) {
    let rate_limit_off = match family {
        Family::V4 => "net.ipv4.icmp_ratelimit=0",
        Family::V6 => "net.ipv6.icmp.ratelimit=0",
    };
    for (local, remote) in pods {
        for pod in [local, remote] {
            pod.netns.exec(&["sysctl", "-qw", rate_limit_off]);
        }
    }
    for cluster in clusters {
        cluster._switch.exec(&["sysctl", "-qw", rate_limit_off]);
    }
    let late = pods
        .iter()
        .flat_map(|(local, remote)| [LateUdp::start(&local.netns), LateUdp::start(&remote.netns)])
        .collect();
    let echoes = pods
        .iter()
        .flat_map(|(local, remote)| {
            [
                Echo::start(&local.netns, "on-cp-1"),
                Echo::start(&remote.netns, "on-worker-1"),
            ]
        })
        .collect();
    (late, echoes)
}

/// Waits until flatnet's agents on both nodes serve each NodePort
/// `(port, protocol)` on `wildcard`'s family with both backends.
pub(super) fn wait_for_node_ports(
    flatnet: &Cluster,
    wildcard: std::net::IpAddr,
    ports: &[(u16, u8)],
) {
    wait_until("flatnet's agents to serve the NodePorts", SETTLE, || {
        ["cp-1", "worker-1"].iter().all(|name| {
            ports.iter().all(|&(port, protocol)| {
                flatnet
                    .node(name)
                    .datapath()
                    .service_backends(&service_key(wildcard, port, protocol))
                    .ok()
                    .flatten()
                    .is_some_and(|set| set.len() == 2)
            })
        })
    });
}

/// The outcome through flatnet's cluster and through kube-proxy's (each
/// with its two backends' namespaces) over `family`, asserted the same and
/// that of working NodePorts: UDP answers from the NodePort, another port
/// refused, closed backends refusing, every late answer's port unreachable
/// back at its backend, large datagrams echoed whole.
pub(super) fn compare_outcomes(
    [flatnet, kube_proxy]: [&Cluster; 2],
    [flatnet_backends, kube_proxy_backends]: [[&Netns; 2]; 2],
    family: Family,
) -> Outcome {
    let through_flatnet = outcome(flatnet, flatnet_backends, family);
    let through_kube_proxy = outcome(kube_proxy, kube_proxy_backends, family);
    assert_eq!(through_flatnet, through_kube_proxy);
    let same = through_flatnet;
    assert!(
        same.udp_answers_from_the_node_port && same.other_port_refused,
        "{same:?}"
    );
    assert!(
        same.closed_backends_refuse.values().all(|&refused| refused),
        "{same:?}"
    );
    assert_eq!(
        same.late_answers_refused_at_the_backends,
        2 * LATE_TRIES,
        "{same:?}"
    );
    assert!(
        same.large_datagrams_echoed.values().all(|&echoed| echoed),
        "{same:?}"
    );
    same
}

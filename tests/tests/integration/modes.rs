//! IPv6 and dual-stack, and the XDP datapath: pods attached by the real
//! binaries with flatnet-ipam handing out an IPv4 and an IPv6 address.

use flatnet_harness::RecvThroughSignals;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use flatnet::config::DatapathMode;
use flatnet_common::action;
use flatnet_tests::*;
use serde_json::json;

/// Sends `count` datagrams from `client` to a UDP echo in `server`; returns
/// how many came back (the rest may be lost, as UDP may).
fn udp_echo(server: &Netns, ip: IpAddr, client: &Netns, count: usize) -> usize {
    let socket = server.run(|| UdpSocket::bind(SocketAddr::new(ip, 0)).unwrap());
    let addr = socket.local_addr().unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = socket.recv_from_through_signals(&mut buf) {
            if &buf[..n] == b"stop" {
                break;
            }
            let _ = socket.send_to(&buf[..n], from);
        }
    });
    let back = client.run(|| {
        let any: IpAddr = if ip.is_ipv6() {
            "::".parse().unwrap()
        } else {
            "0.0.0.0".parse().unwrap()
        };
        let sock = UdpSocket::bind(SocketAddr::new(any, 0)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut back = 0;
        for i in 0..count {
            let message = format!("datagram {i}");
            sock.send_to(message.as_bytes(), addr).unwrap();
            let mut buf = [0u8; 64];
            if let Ok((n, _)) = sock.recv_from_through_signals(&mut buf)
                && buf[..n] == *message.as_bytes()
            {
                back += 1;
            }
        }
        let _ = sock.send_to(b"stop", addr);
        back
    });
    echo.join().unwrap();
    back
}

#[flatnet_test(root)]
fn dual_stack_pods_talk_over_both_families_through_the_redirect() {
    let net = Network::dual_stack("tc");
    let a = net.pod();
    let b = net.pod();
    let routes = a.netns.exec(&["ip", "-6", "route", "show", "default"]);
    assert!(
        routes.contains("via fd42:"),
        "no IPv6 default route: {routes}"
    );
    assert!(
        a.netns
            .exec(&["ip", "route", "show", "default"])
            .contains("via 10.")
    );
    let redirected = net.redirected_bytes();
    let answered = net.action_packets(action::ND_ANSWERED);
    // No wait after ADD: the IPv6 address must be usable at once (no DAD).
    let (ip_a, ip_b) = (a.address(true), b.address(true));
    let global = a
        .netns
        .exec(&["ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"]);
    assert!(
        global.contains(&ip_a.to_string()) && !global.contains("tentative"),
        "{global}"
    );
    tcp_echo_ip(&b.netns, ip_b, &a.netns, 1 << 20);
    tcp_echo_ip(&a.netns, ip_a, &b.netns, 1 << 20);
    // 1 MiB each way, twice: bytes, as BIG TCP segments are few.
    assert!(
        net.redirected_bytes() >= redirected + (4 << 20),
        "IPv6 traffic was not redirected"
    );
    tcp_echo(Some(&b.netns), b.address(false), Some(&a.netns), 1 << 20).expect("IPv4");
    assert!(
        net.action_packets(action::ND_ANSWERED) > answered,
        "no neighbour solicitation answered"
    );
    // The pod resolved its peer to its host veth's MAC, from our answer.
    let host_mac =
        std::fs::read_to_string(format!("/sys/class/net/{}/address", a.host_veth())).unwrap();
    let neighbours = a
        .netns
        .exec(&["ip", "-6", "neigh", "show", &ip_b.to_string()]);
    assert!(neighbours.contains(host_mac.trim()), "{neighbours}");
    // Host to pod and pod to gateway over IPv6.
    tcp_echo_host(ip_a, &a.netns);
    // CHECK knows both addresses.
    let out = CniCall::new("CHECK", &a.container_id, &a.netns.path(), "eth0")
        .run(&bin("flatnet"), &a.stdin_with_prev_result());
    assert!(out.success(), "{out:?}");
}

#[flatnet_test(root)]
fn xdp_mode_pods_talk_tcp_and_udp_over_both_families() {
    let net = Network::dual_stack("xdp");
    let a = net.pod();
    let b = net.pod();
    assert!(net.datapath().is_loaded(DatapathMode::Xdp));
    let host_side = run_ok(std::process::Command::new("ip").args(["link", "show", &a.host_veth()]));
    assert!(
        host_side.contains("xdp"),
        "no XDP program on the host veth: {host_side}"
    );
    assert!(
        b.netns
            .exec(&["ip", "link", "show", "eth0"])
            .contains("xdp"),
        "no XDP on the pod side"
    );
    let redirected = net.redirected_packets();
    for v6 in [false, true] {
        tcp_echo_ip(&b.netns, b.address(v6), &a.netns, 1 << 20);
        tcp_echo_ip(&a.netns, a.address(v6), &b.netns, 1 << 20);
        let back = udp_echo(&b.netns, b.address(v6), &a.netns, 200);
        assert!(
            back >= 190,
            "only {back}/200 datagrams came back over IPv{}",
            if v6 { 6 } else { 4 }
        );
    }
    assert!(net.redirected_packets() > redirected + 400);
    let out = CniCall::new("CHECK", &a.container_id, &a.netns.path(), "eth0")
        .run(&bin("flatnet"), &a.stdin_with_prev_result());
    assert!(out.success(), "{out:?}");
    // Host to pod still goes through the stack.
    tcp_echo_host(a.address(false), &a.netns);
}

#[flatnet_test(root)]
fn switching_a_network_with_pods_to_another_mode_is_refused() {
    let net = Network::dual_stack("tc");
    let _a = net.pod();
    let mut conf = net.conf.clone();
    conf["datapath"] = json!("xdp");
    let netns = Netns::new();
    let out = CniCall::new("ADD", "other-mode", &netns.path(), "eth0")
        .run(&bin("flatnet"), conf.to_string().as_bytes());
    out.assert_error(7, "runs the tc datapath");
    assert!(!link_exists(&net.host_veth("other-mode", "eth0")));
}

fn tcp_echo_ip(server: &Netns, ip: IpAddr, client: &Netns, bytes: usize) {
    tcp_echo(Some(server), ip, Some(client), bytes).unwrap_or_else(|e| panic!("TCP to {ip}: {e}"));
}

fn tcp_echo_host(ip: IpAddr, pod: &Netns) {
    tcp_echo(Some(pod), ip, None, 64 << 10).unwrap_or_else(|e| panic!("host -> {ip}: {e}"));
}

#[flatnet_test(root)]
fn short_icmpv6_messages_keep_the_fast_path() {
    let net = Network::dual_stack("tc");
    let a = net.pod();
    let b = net.pod();
    let ip_b = b.address(true).to_string();
    // Resolve the neighbour first, so what follows is the echoes alone.
    a.netns.exec(&["ping", "-6", "-c", "1", "-W", "2", &ip_b]);
    let (redirected, passed) = (
        net.action_packets(action::REDIRECTED),
        net.action_packets(action::PASSED),
    );
    // 8-byte echo requests (no payload): shorter than a neighbour
    // solicitation, which the datapath once failed to parse and passed on.
    a.netns.exec(&[
        "ping", "-6", "-c", "5", "-i", "0.2", "-s", "0", "-W", "2", &ip_b,
    ]);
    let redirected = net.action_packets(action::REDIRECTED) - redirected;
    let passed = net.action_packets(action::PASSED) - passed;
    // Five requests and five replies, through the redirect. (What the pods
    // send besides, MLD reports and router solicitations, goes to the host
    // stack and is counted there, so `passed` is only shown.)
    assert!(
        redirected >= 10,
        "only {redirected} redirected, {passed} passed"
    );
}

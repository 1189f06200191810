//! Both families cross the tunnel: IPv6 pods over an IPv4 underlay, and
//! both families' pods over an IPv6 underlay.

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::*;

use super::fixture::route_of;

#[flatnet_test(root)]
fn ipv6_pods_cross_the_tunnel_over_an_ipv4_underlay() {
    let mut specs = Cluster::numbered(3, true);
    let n3 = specs.pop().expect("n3").on_segment(1);
    specs.push(n3);
    let cluster = Cluster::started(&specs, &[]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    // The tunnel ends at n3's preferred address, IPv4: IPv6 pods ride it.
    let line = n1
        .netns
        .exec(&["ip", "-6", "route", "show", "proto", ROUTE_PROTO])
        .lines()
        .find(|l| l.starts_with("fd44:0:0:3::/64"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        line.contains("dst 172.30.1.3") && line.contains("dev flatnet.vxlan"),
        "n1's IPv6 route to n3: {line:?}"
    );
    let (a, c) = (n1.pod(), n3.pod());
    let (a6, c6) = (a.ip6.expect("a's IPv6"), c.ip6.expect("c's IPv6"));
    let encapsulated = n1.bytes(action::TO_TUNNEL);
    tcp_echo(Some(&c.netns), c6, Some(&a.netns), 1 << 20).expect("n1 -> n3 over IPv6");
    tcp_echo(Some(&a.netns), a6, Some(&c.netns), 1 << 20).expect("n3 -> n1 over IPv6");
    // The fast path set an IPv4 tunnel key on IPv6 packets.
    assert!(n1.bytes(action::TO_TUNNEL) > encapsulated + (2 << 20));
    assert!(n3.bytes(action::TUNNEL_TO_POD) > 2 << 20);
}

/// A live TCP stream n3 -> n1 through the tunnel while both nodes' agents
/// restart, then while both nodes' datapaths are upgraded (their programs
/// made to look like an older build's, and `TUNNEL` missing as in builds
/// before it: the agent of this build loads its own, moves the pods, the
/// uplink and the VXLAN device over, and points the new map at the
/// device). Nothing lost; afterwards the new programs carry the stream.
/// Dual-stack nodes listed IPv6 first: the tunnel's underlay is IPv6
/// (outer IPv6 with a UDP checksum, 70 bytes of overhead: pods' MTU 1430),
/// and both families' pods cross it, on the fast path.
#[flatnet_test(root)]
fn pods_cross_the_tunnel_over_an_ipv6_underlay() {
    let mut specs = Cluster::numbered(3, true);
    let n3 = specs.pop().expect("n3").on_segment(1);
    specs.push(n3);
    let mut cluster = Cluster::new(&specs);
    for node in &mut cluster.nodes {
        node.agent_flags = vec!["--routing".into(), "vxlan".into()];
    }
    // The peer file with each node's IPv6 address first: its preferred one.
    let mut text = String::from("nodes:\n");
    for spec in &specs {
        text.push_str(&format!(
            "  - name: {}\n    addresses: ['{}', {}]\n    podCIDRs: [{}, '{}']\n",
            spec.name,
            spec.address6(),
            spec.address(),
            spec.pod_cidr.as_deref().expect("a pod CIDR"),
            spec.pod_cidr6()
        ));
    }
    std::fs::write(&cluster.peer_file, text).expect("peer file");
    for node in &cluster.nodes {
        node.start_agent(&cluster.file());
    }
    for node in &cluster.nodes {
        node.wait_ready();
    }
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    let line = route_of(n1, "10.244.3.0/24");
    assert!(
        line.contains("encap ip6") && line.contains("dst fd30:0:0:1::3"),
        "n1's route to n3: {line}"
    );
    assert_eq!(n1.conflist()["plugins"][0]["mtu"], 1430);
    let (a, c) = (n1.pod(), n3.pod());
    let (a6, c6) = (a.ip6.expect("a's IPv6"), c.ip6.expect("c's IPv6"));
    let encapsulated = n1.bytes(action::TO_TUNNEL);
    tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1 << 20).expect("n1 -> n3, IPv4 pods");
    tcp_echo(Some(&a.netns), a6, Some(&c.netns), 1 << 20).expect("n3 -> n1, IPv6 pods");
    tcp_echo(Some(&c.netns), c6, Some(&a.netns), 1 << 20).expect("n1 -> n3, IPv6 pods");
    assert!(n1.bytes(action::TO_TUNNEL) > encapsulated + (3 << 20));
    assert!(n3.bytes(action::TUNNEL_TO_POD) > 3 << 20);
    // A datagram at the pods' MTU crosses whole.
    let source = udp_source(&a.netns, a.ip, &c.netns, c.ip, 1430 - 28);
    assert_eq!(source, std::net::IpAddr::V4(a.ip));
    // The stack's own encap routes carry the same (the agents stopped, the
    // datapath's device forgotten: every packet takes the routes).
    n1.stop_agent();
    n3.stop_agent();
    n1.datapath().set_tunnel(None).expect("clear TUNNEL");
    n3.datapath().set_tunnel(None).expect("clear TUNNEL");
    let passed = n1.packets(action::REMOTE_PASSED);
    tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1 << 16).expect("n1 -> n3 through the routes");
    assert!(n1.packets(action::REMOTE_PASSED) > passed);
}

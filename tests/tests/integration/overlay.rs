//! Nodes on different subnets (`--routing`): n1 and n2 share a segment,
//! n3 is on another behind a router (the switch namespace), with no L2
//! adjacency to them. host-gw cannot reach n3; VXLAN between node
//! addresses can, decided per peer in `auto` mode.

use std::time::Duration;

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::metric;
use flatnet_tests::*;

/// n1 and n2 on segment 0, n3 on segment 1.
fn split_specs() -> Vec<NodeSpec> {
    let mut specs = Cluster::numbered(3, false);
    let n3 = specs.pop().expect("n3").on_segment(1);
    specs.push(n3);
    specs
}

/// flatnet's IPv4 routes on `node`, whole lines as `ip route` shows them.
fn route_lines(node: &SimNode) -> Vec<String> {
    let mut lines: Vec<String> = node
        .netns
        .exec(&["ip", "-4", "route", "show", "proto", ROUTE_PROTO])
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The route line of `cidr` on `node`.
fn route_of(node: &SimNode, cidr: &str) -> String {
    route_lines(node)
        .into_iter()
        .find(|line| line.starts_with(cidr))
        .unwrap_or_else(|| {
            panic!(
                "{}: no route of {cidr} in {:?}",
                node.spec.name,
                route_lines(node)
            )
        })
}

/// What the router between the segments (the switch namespace) forwards,
/// counted by nftables there: packets with a pod address in their outer
/// header, and VXLAN packets (UDP 8472). Only what it routes to or from
/// segment 1, n3's alone: with br_netfilter loaded, frames bridged within
/// segment 0 meet the forward hook too. The table goes with the namespace.
struct Underlay<'a> {
    router: &'a Netns,
}

impl<'a> Underlay<'a> {
    fn watch(router: &'a Netns) -> Self {
        router.exec(&["nft", "add", "table", "inet", "probe"]);
        router.exec(&[
            "nft",
            "add",
            "chain",
            "inet",
            "probe",
            "forward",
            "{ type filter hook forward priority 0; policy accept; }",
        ]);
        for rule in [
            "oifname br1 ip saddr 10.244.0.0/16 counter",
            "iifname br1 ip saddr 10.244.0.0/16 counter",
            "iifname br1 udp dport 8472 counter",
            // VXLAN's VNI: 24 bits, 4 bytes into the UDP payload.
            "iifname br1 udp dport 8472 @th,96,24 1 counter",
        ] {
            let mut args = vec!["nft", "add", "rule", "inet", "probe", "forward"];
            args.extend(rule.split_whitespace());
            router.exec(&args);
        }
        Underlay { router }
    }

    /// (packets with a pod address outside a tunnel, VXLAN packets, those
    /// of them with VNI 1).
    fn counts(&self) -> (u64, u64, u64) {
        let listed = self
            .router
            .exec(&["nft", "-j", "list", "table", "inet", "probe"]);
        let json: serde_json::Value = serde_json::from_str(&listed).expect("nft's JSON");
        let counters: Vec<u64> = json["nftables"]
            .as_array()
            .expect("nftables")
            .iter()
            .filter_map(|item| item["rule"]["expr"].as_array())
            .filter_map(|expr| expr.iter().find_map(|e| e["counter"]["packets"].as_u64()))
            .collect();
        assert_eq!(counters.len(), 4, "{listed}");
        (counters[0] + counters[1], counters[2], counters[3])
    }
}

/// Packets the node's VXLAN device sent.
fn tunnelled(node: &SimNode) -> u64 {
    let shown = node
        .netns
        .exec(&["ip", "-s", "-j", "link", "show", "flatnet.vxlan"]);
    let json: serde_json::Value = serde_json::from_str(&shown).expect("ip's JSON");
    json[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .expect("tx packets")
}

#[flatnet_test(root)]
fn host_gw_cannot_reach_a_node_on_another_subnet() {
    let cluster = Cluster::started(&split_specs(), &["--routing", "direct"]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    // The kernel refuses a next hop that is not on a connected subnet: the
    // route is missing, reported, and n3's pods unreachable.
    assert!(
        !route_lines(n1)
            .iter()
            .any(|l| l.starts_with("10.244.3.0/24")),
        "{:?}",
        route_lines(n1)
    );
    assert!(
        metric(&n1.metrics(), "flatnet_peer_routes_missing").is_some_and(|n| n >= 1.0),
        "the missing route is not reported"
    );
    let (a, c) = (n1.pod(), n3.pod());
    assert!(
        tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1000).is_err(),
        "n1 reached n3's pod without a tunnel"
    );
    assert!(
        !n1.has_link("flatnet.vxlan"),
        "a VXLAN device with --routing direct"
    );
}

#[flatnet_test(root)]
fn auto_routes_the_shared_segment_and_tunnels_to_the_other_subnet() {
    let cluster = Cluster::started(&split_specs(), &[]);
    let (n1, n2, n3) = (cluster.node("n1"), cluster.node("n2"), cluster.node("n3"));
    // n1 -> n2 direct; n1 -> n3 and n3 -> both through the VXLAN device.
    assert_eq!(
        route_of(n1, "10.244.2.0/24")
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>(),
        ["10.244.2.0/24", "via", "172.30.0.2"]
    );
    for (node, cidr, peer) in [
        (n1, "10.244.3.0/24", "172.30.1.3"),
        (n3, "10.244.1.0/24", "172.30.0.1"),
        (n3, "10.244.2.0/24", "172.30.0.2"),
    ] {
        let line = route_of(node, cidr);
        for part in [
            "encap ip id 1".to_string(),
            format!("dst {peer}"),
            "dev flatnet.vxlan".into(),
        ] {
            assert!(
                line.contains(&part),
                "{}: {line} lacks {part}",
                node.spec.name
            );
        }
    }
    // The pods' MTU leaves room for VXLAN's 50 bytes.
    for node in [n1, n2, n3] {
        assert_eq!(
            node.conflist()["plugins"][0]["mtu"],
            1450,
            "{}",
            node.spec.name
        );
    }
    let underlay = Underlay::watch(&cluster._switch);
    let (a, b, c) = (n1.pod(), n2.pod(), n3.pod());
    // n1 -> n2 is host-gw on the shared segment: nothing tunnelled.
    let sent = tunnelled(n1);
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 16).expect("n1 -> n2");
    assert_eq!(tunnelled(n1), sent, "n1 -> n2 went through the tunnel");
    for (from, to, what) in [
        (&a, &c, "n1 -> n3"),
        (&c, &a, "n3 -> n1"),
        (&b, &c, "n2 -> n3"),
        (&a, &b, "n1 -> n2"),
    ] {
        tcp_echo(Some(&to.netns), to.ip, Some(&from.netns), 4 << 20)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // A full-size datagram at the pods' MTU crosses the tunnel.
    let source = udp_source(&a.netns, a.ip, &c.netns, c.ip, 1450 - 28);
    assert_eq!(source, std::net::IpAddr::V4(a.ip));
    assert!(tunnelled(n1) > sent, "n1 -> n3 did not use the tunnel");
    // The fast path encapsulated and delivered it, not the stack: n3's
    // stack forwarded nothing of n1's or n2's 4 MiB. (Bytes: the pods' TCP
    // sends GSO packets of up to 64 KiB, each counted once.)
    for node in [n1, n2, n3] {
        let (encapsulated, delivered) = (
            node.bytes(action::TO_TUNNEL),
            node.bytes(action::TUNNEL_TO_POD),
        );
        assert!(
            encapsulated > 4 << 20 && delivered > 4 << 20,
            "{}: {encapsulated} bytes encapsulated, {delivered} delivered by the datapath",
            node.spec.name
        );
    }
    assert!(
        n3.forwarded() < 100,
        "n3's stack forwarded {} datagrams",
        n3.forwarded()
    );
    for line in [
        "10.244.3.0/24 vxlan 172.30.1.3",
        "10.244.2.0/24 via 172.30.0.2",
    ] {
        assert!(
            n1.remote_cidrs().iter().any(|l| l == line),
            "{:?} lacks {line}",
            n1.remote_cidrs()
        );
    }
    // Between the segments only VXLAN: no pod address outside the tunnel.
    let (bare, vxlan, vni_1) = underlay.counts();
    assert_eq!(bare, 0, "pod addresses crossed the router unencapsulated");
    assert!(vxlan > 100, "the router saw {vxlan} VXLAN packets");
    assert_eq!(vni_1, vxlan, "VXLAN packets with another VNI than 1");
}

#[flatnet_test(root)]
fn vxlan_mode_tunnels_every_peer() {
    let cluster = Cluster::started(&split_specs(), &["--routing", "vxlan"]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let line = route_of(n1, "10.244.2.0/24");
    assert!(
        line.contains("dst 172.30.0.2") && line.contains("dev flatnet.vxlan"),
        "{line}"
    );
    // In the fast path's map as tunnelled: their far end is the node.
    assert_eq!(
        n1.remote_cidrs(),
        [
            "10.244.2.0/24 vxlan 172.30.0.2",
            "10.244.3.0/24 vxlan 172.30.1.3"
        ]
    );
    let (a, b) = (n1.pod(), n2.pod());
    let encapsulated = n1.bytes(action::TO_TUNNEL);
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2 through VXLAN");
    assert!(n1.bytes(action::TO_TUNNEL) > encapsulated + (1 << 20));
    assert!(n2.bytes(action::TUNNEL_TO_POD) > 1 << 20);
    // n2 leaves: its tunnelled route and its next hop's neighbour entry go.
    let next_hop = || {
        n1.netns
            .exec(&["ip", "neigh", "show", "dev", "flatnet.vxlan"])
            .contains("10.244.2.0 ")
    };
    assert!(next_hop(), "no neighbour entry for n2's next hop");
    let without_n2: Vec<NodeSpec> = split_specs()
        .into_iter()
        .filter(|spec| spec.name != "n2")
        .collect();
    cluster.write_peers(&without_n2);
    wait_until("n1 to forget n2", SETTLE, || {
        !route_lines(n1)
            .iter()
            .any(|l| l.starts_with("10.244.2.0/24"))
            && !next_hop()
    });
}

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

/// XDP mode: `from_pod_xdp` cannot set a tunnel key, so the host stack
/// carries tunnelled packets over the same device and routes (and
/// `from_tunnel` hands everything to it): the fallback path, both ways.
#[flatnet_test(root)]
fn xdp_mode_leaves_the_tunnel_to_the_stack() {
    let cluster = Cluster::started(&split_specs(), &["--datapath", "xdp"]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    let (a, c) = (n1.pod(), n3.pod());
    tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1 << 20).expect("n1 -> n3 in XDP mode");
    tcp_echo(Some(&a.netns), a.ip, Some(&c.netns), 1 << 20).expect("n3 -> n1 in XDP mode");
    for node in [n1, n3] {
        assert_eq!(node.packets(action::TO_TUNNEL), 0, "{}", node.spec.name);
        assert_eq!(node.packets(action::TUNNEL_TO_POD), 0, "{}", node.spec.name);
        assert!(
            node.bytes(action::REMOTE_PASSED) > 1 << 20,
            "{}: the stack did not carry it",
            node.spec.name
        );
    }
}

#[flatnet_test(root)]
fn a_tunnelled_stream_survives_agent_restarts_and_a_datapath_upgrade() {
    let cluster = Cluster::started(&split_specs(), &[]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    let (a, c) = (n1.pod(), n3.pod());
    let routes_before = (route_lines(n1), route_lines(n3));
    let (sent, received) = stream_during(&c.netns, c.ip, &a.netns, || {
        for node in [n1, n3] {
            node.stop_agent();
            // The device and its routes carry the stream without the agent.
            std::thread::sleep(Duration::from_millis(300));
            node.start_agent(&cluster.file());
            node.wait_ready();
        }
    });
    assert_eq!(sent, received, "bytes were lost across agent restarts");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");
    // A restarted agent finds its device and routes as they were.
    assert_eq!((route_lines(n1), route_lines(n3)), routes_before);

    let tunnel_program = |node: &SimNode| {
        node.datapath()
            .program(flatnet_common::PROG_FROM_TUNNEL)
            .and_then(|p| p.id())
            .expect("from_tunnel's id")
    };
    let before = [tunnel_program(n1), tunnel_program(n3)];
    let (sent, received) = stream_during(&c.netns, c.ip, &a.netns, || {
        for node in [n1, n3] {
            let datapath = node.datapath();
            for name in [
                flatnet_common::PROG_FROM_POD,
                flatnet_common::PROG_FROM_UPLINK,
                flatnet_common::PROG_FROM_TUNNEL,
            ] {
                let pinned = datapath.program_path(name);
                let older = pinned.with_file_name(format!("{name}-000000000000"));
                std::fs::rename(&pinned, &older).expect("age the pinned program");
            }
            std::fs::remove_file(datapath.map_path(flatnet_common::MAP_TUNNEL))
                .expect("unpin TUNNEL");
            node.stop_agent();
            node.start_agent(&cluster.file());
            node.wait_ready();
        }
    });
    assert_eq!(sent, received, "bytes were lost across the upgrade");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");
    for (node, old) in [n1, n3].into_iter().zip(before) {
        let new = tunnel_program(node);
        assert_ne!(new, old, "{}: no new from_tunnel", node.spec.name);
        let attached: Vec<u32> = node
            .netns
            .run(|| tc_hooks("flatnet.vxlan"))
            .into_iter()
            .map(|hook| hook.program_id)
            .collect();
        assert!(
            attached.contains(&new) && !attached.contains(&old),
            "{}: the VXLAN device runs {attached:?}, not {new}",
            node.spec.name
        );
    }
    let (encapsulated, delivered) = (n3.bytes(action::TO_TUNNEL), n1.bytes(action::TUNNEL_TO_POD));
    tcp_echo(Some(&a.netns), a.ip, Some(&c.netns), 1 << 20).expect("n3 -> n1 after");
    assert!(n3.bytes(action::TO_TUNNEL) > encapsulated + (1 << 20));
    assert!(n1.bytes(action::TUNNEL_TO_POD) > delivered + (1 << 20));
}

/// A node can only send from its own pod CIDR through the tunnel: n3's
/// stack sends (through its VXLAN device, outer source n3's address)
/// packets claiming n2's pod CIDR and n1's own pod's address; n1 drops
/// them at its device and counts them, while n3's own pods get through.
#[flatnet_test(root)]
fn a_node_cannot_send_other_pods_addresses_through_the_tunnel() {
    let cluster = Cluster::started(&split_specs(), &[]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    let (a, c) = (n1.pod(), n3.pod());
    tcp_echo(Some(&a.netns), a.ip, Some(&c.netns), 1 << 16).expect("n3's pod -> n1's pod");
    let refused = n1.packets(action::TUNNEL_SOURCE_REFUSED);
    assert_eq!(refused, 0, "n1 refused n3's own pod");
    // n3's node sends from addresses that are not its pods': another
    // node's pod CIDR (n2's), and n1's pod itself. Its route to n1's CIDR
    // is the tunnel's, so the packets leave encapsulated from n3.
    let unused_in_n1 = "10.244.1.200";
    for spoofed in ["10.244.2.77".to_string(), a.ip.to_string()] {
        n3.netns
            .exec(&["ip", "addr", "add", &format!("{spoofed}/32"), "dev", "lo"]);
        let target = if spoofed == a.ip.to_string() {
            unused_in_n1.to_string()
        } else {
            a.ip.to_string()
        };
        // No answer comes back: only the count of what n1 refused matters.
        let _ = n3
            .netns
            .command(&[
                "ping", "-c", "5", "-i", "0.05", "-W", "1", "-I", &spoofed, &target,
            ])
            .output();
        n3.netns
            .exec(&["ip", "addr", "del", &format!("{spoofed}/32"), "dev", "lo"]);
    }
    assert_eq!(
        n1.packets(action::TUNNEL_SOURCE_REFUSED),
        10,
        "n1 did not refuse exactly the 10 spoofed packets"
    );
    tcp_echo(Some(&a.netns), a.ip, Some(&c.netns), 1 << 16).expect("n3's pod -> n1's pod after");
}

#[flatnet_test(root)]
fn a_peer_that_changes_its_address_is_tunnelled_to_at_the_new_one() {
    let specs = split_specs();
    let cluster = Cluster::started(&specs, &[]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    let (a, c) = (n1.pod(), n3.pod());
    tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1 << 16).expect("n1 -> n3 before");
    // n3 is re-addressed on its segment (172.30.1.3 -> 172.30.1.33), and
    // the node list says so.
    let mut moved = specs.clone();
    moved[2].index = 33;
    // (The old address first: deleting a primary address takes its
    // secondaries along; the route through the router goes with it.)
    for command in [
        format!("ip addr del {}/24 dev up0", specs[2].address()),
        format!("ip addr add {}/24 dev up0", moved[2].address()),
        "ip route replace 172.30.0.0/16 via 172.30.1.254".to_string(),
    ] {
        n3.netns
            .exec(&command.split_whitespace().collect::<Vec<_>>());
    }
    cluster.write_peers(&moved);
    // Within a reconcile: n1's tunnel ends at the new address, n3's device
    // answers to the MAC derived from it (and, since a MAC change flushes
    // the device's neighbours, n3 writes its next hops again).
    wait_until("n1 to tunnel to n3's new address", SETTLE, || {
        route_of(n1, "10.244.3.0/24").contains("dst 172.30.1.33")
    });
    wait_until("n3's device to take its new MAC", SETTLE, || {
        n3.netns
            .exec(&["ip", "link", "show", "flatnet.vxlan"])
            .contains("0e:66:ac:1e:01:21")
    });
    tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1 << 16).expect("n1 -> n3 after the move");
    tcp_echo(Some(&a.netns), a.ip, Some(&c.netns), 1 << 16).expect("n3 -> n1 after the move");
}

/// Pods given more MTU than the tunnel has (`--mtu 1500` over VXLAN's
/// 1450): a full-size packet gets an ICMP "too big" back from the node, the
/// pod learns the path's MTU, and a TCP stream crosses (no black hole).
#[flatnet_test(root)]
fn a_packet_too_big_for_the_tunnel_gets_too_big_back_to_the_pod() {
    let cluster = Cluster::started(&split_specs(), &["--mtu", "1500"]);
    let (n1, n3) = (cluster.node("n1"), cluster.node("n3"));
    assert_eq!(n1.conflist()["plugins"][0]["mtu"], 1500);
    let (a, c) = (n1.pod(), n3.pod());
    tcp_echo(Some(&c.netns), c.ip, Some(&a.netns), 1 << 20)
        .expect("n1 -> n3 past the tunnel's MTU");
    let cached = a.netns.exec(&["ip", "route", "get", &c.ip.to_string()]);
    assert!(
        cached.contains("mtu 1450"),
        "pod a learnt no path MTU to n3's pod: {cached}"
    );
}

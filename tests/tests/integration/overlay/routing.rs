//! Which peers are tunnelled to: host-gw cannot reach a node on another
//! subnet, `auto` routes the shared segment and tunnels to the other (the
//! router sees only VXLAN), `vxlan` tunnels every peer, and a peer that
//! changes its address is tunnelled to at the new one.

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::metric;
use flatnet_tests::*;

use super::fixture::{route_lines, route_of, split_specs, tunnelled};

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

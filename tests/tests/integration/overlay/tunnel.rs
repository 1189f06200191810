//! What crosses the tunnel and how: XDP mode leaves it to the stack, a
//! tunnelled stream survives agent restarts and a datapath upgrade, a node
//! cannot send other pods' addresses through it, and a packet too big for
//! it gets "too big" back to the pod.

use std::time::Duration;

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::*;

use super::fixture::{route_lines, split_specs};

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

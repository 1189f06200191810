//! A fresh node has IPv4 and IPv6 forwarding off. Everything the datapath
//! leaves to the host stack is forwarded by it: traffic to a shaped pod, a
//! Service's DNAT (kube-proxy's rules), a pod talking to the outside without
//! ipMasq, another node's pods on the stack path. flatnet's ADD turns
//! forwarding on for its families itself, as the reference bridge plugin
//! does; CHECK and STATUS say when it has been turned off under live pods.
//! Each case starts from forwarding off and has no agent to turn it on.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use flatnet_common::action;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_proxy::{Mode, Protocol, ServicePort};
use flatnet_tests::*;
use serde_json::json;

const ON: &str = "1";
const OFF: &str = "0";

fn off() -> (String, String) {
    (OFF.into(), OFF.into())
}

/// CHECK of `pod` against its ADD result.
fn check(pod: &Pod) -> CniOutput {
    CniCall::new("CHECK", &pod.container_id, &pod.netns.path(), "eth0")
        .run(&bin("flatnet"), &pod.stdin_with_prev_result())
}

/// On the host: ADD turns on its family's forwarding only; a shaped pod is
/// reached through the stack; CHECK and STATUS report forwarding turned off
/// under live pods, and the next ADD turns it on again.
#[flatnet_test(root, tools = reference_plugins(&["bandwidth"]))]
fn add_turns_forwarding_on_and_check_and_status_report_it_off() {
    let net = Network::flatnet_ipam();
    // Both off, as on a fresh machine (this binary's host tests start so;
    // set again here so the test does not depend on its neighbours).
    let _restore = forwarding::Saved::host();
    for name in forwarding::SWITCHES {
        run_ok(Command::new("sysctl").args(["-qw", &format!("{name}=0")]));
    }
    assert_eq!(forwarding::host(), off());

    // A pod shaped by the bandwidth plugin after flatnet: the datapath hands
    // what is sent to it to the host stack, whose tbf shapes it.
    let mut flatnet = net.plugin_entry();
    flatnet["capabilities"] = json!({"bandwidth": true});
    let list = Conflist::new(json!({
        "cniVersion": "1.0.0",
        "name": net.name,
        "plugins": [flatnet, {"type": "bandwidth", "capabilities": {"bandwidth": true}}],
    }));
    let netns = Netns::new();
    let call = CniCall::new("ADD", &unique("ctr-"), &netns.path(), "eth0");
    let shaped = ListAttachment::add(
        &list,
        call,
        json!({"bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 1_048_576}}),
    )
    .expect("ADD of a shaped pod");
    // IPv4 only: IPv6 forwarding (which stops router advertisements from
    // being accepted on accept_ra=1 interfaces) is left alone.
    assert_eq!(
        forwarding::host(),
        (ON.into(), OFF.into()),
        "an IPv4 network's ADD turns on IPv4 forwarding only"
    );
    let shaped_ip = match result_ips(&shaped.result).first() {
        Some(IpAddr::V4(ip)) => *ip,
        other => panic!("no IPv4 address: {other:?}"),
    };
    let other = net.pod();
    let before = net.action_packets(action::SHAPED);
    tcp_echo(Some(&netns), shaped_ip, Some(&other.netns), 200_000)
        .expect("pod -> shaped pod, forwarded by the host stack");
    assert!(net.action_packets(action::SHAPED) > before);

    // Turned off under live pods: CHECK and STATUS say so.
    run_ok(Command::new("sysctl").args(["-qw", "net.ipv4.ip_forward=0"]));
    check(&other).assert_error(102, "IPv4 forwarding is off (net.ipv4.ip_forward = 0)");
    let mut status_conf = net.conf.clone();
    status_conf["cniVersion"] = json!("1.1.0");
    let status = CniCall {
        command: "STATUS".into(),
        path: cni_path(),
        ..CniCall::default()
    }
    .run(&bin("flatnet"), status_conf.to_string().as_bytes());
    status.assert_error(51, "IPv4 forwarding is off");
    assert!(
        status.json()["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("sysctl -w")
    );

    // The next ADD turns it on again, and both pass.
    let third = net.pod();
    assert_eq!(forwarding::host().0, ON);
    let checked = check(&other);
    assert!(checked.success(), "{checked:?}");
    tcp_echo(Some(&third.netns), third.ip(), Some(&other.netns), 10_000).expect("pod -> pod");

    // A dual-stack network's ADD turns IPv6 forwarding on too.
    let dual = Network::dual_stack("tc");
    let _pod6 = dual.pod();
    assert_eq!(forwarding::host(), (ON.into(), ON.into()));
}

/// The simulated cluster: nodes start with forwarding off, and once their
/// agents (which turn it on at start) are stopped and it is off again,
/// flatnet's ADD alone makes every stack path work: a ClusterIP through
/// kube-proxy's rules, a pod to an outside host without ipMasq, and a pod
/// to another node's pod on the stack path.
#[flatnet_test(root)]
fn every_stack_path_works_on_a_node_whose_forwarding_the_plugin_turned_on() {
    let cluster = Cluster::started(&Cluster::numbered(2, true), &[]);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    for node in [n1, n2] {
        node.stop_agent();
        forwarding::off_in(&node.netns);
        assert_eq!(forwarding::of(&node.netns), off());
    }

    // An outside host on n1's own link, routing the pod CIDR back via n1.
    let outside = OutsideHost::new(Some(&n1.netns), "192.168.77");
    outside
        .netns
        .exec(&["ip", "route", "add", "10.244.0.0/16", "via", "192.168.77.1"]);

    let client = n1.pod();
    let backend = n1.pod();
    let remote = n2.pod();
    // Dual-stack pods: both families turned on, on each node by its ADD.
    for node in [n1, n2] {
        assert_eq!(
            forwarding::of(&node.netns),
            (ON.into(), ON.into()),
            "after ADD on {}",
            node.spec.name
        );
    }

    // ClusterIP -> a backend on the same node: DNAT by kube-proxy's rules.
    cluster.program_kube_proxy(
        Mode::Iptables,
        &[ServicePort::cluster_ip(
            "web",
            "10.96.0.10".parse().expect("ClusterIP"),
            80,
            Protocol::Tcp,
            vec![SocketAddr::new(IpAddr::V4(backend.ip), 8080)],
        )],
    );
    tcp_echo_via(
        Some(&backend.netns),
        SocketAddr::new(IpAddr::V4(backend.ip), 8080),
        Some(&client.netns),
        Some(SocketAddr::new(
            "10.96.0.10".parse().expect("ClusterIP"),
            80,
        )),
        100_000,
    )
    .expect("pod -> ClusterIP -> backend on the same node");

    // To the outside without ipMasq: it sees the pod's own address.
    let to_outside = udp_source(
        &client.netns,
        client.ip,
        &outside.netns,
        outside.address(),
        100,
    );
    assert_eq!(to_outside, IpAddr::V4(client.ip), "not masqueraded");

    // To another node's pod on the stack path: a datagram too big for n1's
    // shrunken uplink is refused by the fast path's FIB lookup and left to
    // the stack to fragment and forward.
    n1.netns.exec(&["ip", "link", "set", "up0", "mtu", "1400"]);
    let (passed, forwarded) = (n1.packets(action::REMOTE_PASSED), n1.forwarded());
    let source = udp_source(&client.netns, client.ip, &remote.netns, remote.ip, 1472);
    assert_eq!(source, IpAddr::V4(client.ip));
    assert!(
        n1.packets(action::REMOTE_PASSED) > passed,
        "not handed to the stack"
    );
    assert!(n1.forwarded() > forwarded, "the stack did not route it");
    // And a connection the other way, within the MTU.
    tcp_echo(Some(&client.netns), client.ip, Some(&remote.netns), 10_000).expect("n2 -> n1");
    // The outside link goes with n1's namespace when the cluster drops.
}

//! End to end on one node: pods (network namespaces) attached by the real
//! `flatnet` binary, real TCP traffic, and the BPF maps read back.

use std::time::Duration;

use flatnet_common::action;
use flatnet_tests::*;

/// DEL cuts a link off at once and leaves its unregister (tens of ms of RCU
/// waiting in the kernel) to a detached reaper: wait for it to vanish.
fn wait_gone(link: &str) -> bool {
    wait_link_gone(link, Duration::from_secs(10))
}

/// True when the link is gone or administratively down.
fn down_or_gone(link: &str) -> bool {
    match std::fs::read_to_string(format!("/sys/class/net/{link}/flags")) {
        Err(_) => true,
        Ok(flags) => {
            u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).is_ok_and(|f| f & 1 == 0)
        }
    }
}

#[flatnet_test(root)]
fn two_pods_exchange_tcp_both_ways_through_the_redirect() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    let redirected_before = net.redirected_bytes();
    let passed_before = net.action_packets(action::PASSED);
    let gateway_before = link_packets(&net.gateway_device);

    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 2 << 20).expect("a -> b");
    tcp_echo(Some(&a.netns), a.ip(), Some(&b.netns), 2 << 20).expect("b -> a");

    // 8 MiB crossed (2 MiB each way, echoed, twice), all redirected; in
    // BIG TCP segments that is a few hundred packets, so bytes tell.
    let redirected = net.redirected_bytes() - redirected_before;
    assert!(
        redirected >= 8 << 20,
        "only {redirected} bytes were redirected"
    );
    let gateway_after = link_packets(&net.gateway_device);
    assert_eq!(
        gateway_after, gateway_before,
        "packets crossed the gateway device"
    );
    // This network's pods handed (nearly) nothing to the host stack: the
    // datapath counts every frame it sees, other tests' traffic not.
    let passed = net.action_packets(action::PASSED) - passed_before;
    assert!(passed < 10, "{passed} packets went to the host stack");
}

#[flatnet_test(root)]
fn pods_learn_every_neighbour_from_the_datapath_arp_answer() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    let answered_before = net.action_packets(action::ARP_ANSWERED);
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 1000).expect("a -> b");
    let host_mac =
        std::fs::read_to_string(format!("/sys/class/net/{}/address", a.host_veth())).unwrap();
    let neighbours = a.netns.exec(&["ip", "neigh", "show", &b.ip().to_string()]);
    assert!(
        neighbours.contains(host_mac.trim()),
        "pod a resolved {} to {neighbours:?}, not its host veth {host_mac}",
        b.ip()
    );
    assert!(net.action_packets(action::ARP_ANSWERED) > answered_before);
}

#[flatnet_test(root)]
fn pod_to_host_and_host_to_pod() {
    let net = Network::host_local();
    let pod = net.pod();
    let passed_before = net.action_packets(action::PASSED);
    // Pod to the host: the gateway address lives on the host's gateway device.
    tcp_echo(None, net.gateway(), Some(&pod.netns), 256 << 10).expect("pod -> host");
    // Host to pod: the /32 route and permanent neighbour on the host veth.
    tcp_echo(Some(&pod.netns), pod.ip(), None, 256 << 10).expect("host -> pod");
    assert!(
        net.action_packets(action::PASSED) > passed_before,
        "pod->host goes through the stack"
    );
    let routes = run_ok(std::process::Command::new("ip").args([
        "route",
        "show",
        &format!("{}/32", pod.ip()),
    ]));
    assert!(routes.contains(&pod.host_veth()), "{routes}");
}

#[flatnet_test(root)]
fn del_twice_succeeds_and_releases_everything() {
    let net = Network::host_local();
    let keep = net.pod();
    let pod = net.pod();
    let (veth, ip) = (pod.host_veth(), pod.ip());
    assert!(link_exists(&veth));
    assert!(net.datapath().endpoint(ip.into()).unwrap().is_some());
    assert_eq!(net.ipam_allocations().len(), 2);
    for _ in 0..2 {
        let out = pod.call("DEL");
        assert!(out.success(), "{out:?}");
        assert!(out.stdout.trim().is_empty(), "DEL prints nothing: {out:?}");
        assert!(down_or_gone(&veth), "the pod is still connected after DEL");
    }
    assert!(wait_gone(&veth), "{veth} was never removed");
    assert!(net.datapath().endpoint(ip.into()).unwrap().is_none());
    assert_eq!(net.ipam_allocations(), vec![keep.ip().to_string()]);
    // The other pod is untouched.
    tcp_echo(Some(&keep.netns), keep.ip(), None, 1000).expect("host -> remaining pod");
}

#[flatnet_test(root)]
fn del_after_the_netns_is_gone_succeeds() {
    let net = Network::host_local();
    let _keep = net.pod();
    let pod = net.pod();
    let (veth, ip) = (pod.host_veth(), pod.ip());
    run_ok(std::process::Command::new("ip").args(["netns", "del", &pod.netns.name]));
    // The kernel destroys a dead namespace's veths asynchronously: wait, so
    // DEL really meets a pod whose netns and veth are both gone.
    wait_until(
        "the veth to go with its namespace",
        Duration::from_secs(10),
        || !link_exists(&veth),
    );
    let out = pod.call("DEL");
    assert!(out.success(), "{out:?}");
    assert!(
        net.datapath().endpoint(ip.into()).unwrap().is_none(),
        "stale endpoint left"
    );
    assert_eq!(net.ipam_allocations().len(), 1, "address not released");
}

#[flatnet_test(root)]
fn check_passes_on_a_healthy_pod_and_names_what_broke() {
    let net = Network::host_local();
    let check = |pod: &Pod| {
        CniCall::new("CHECK", &pod.container_id, &pod.netns.path(), &pod.ifname)
            .run(&bin("flatnet"), &pod.stdin_with_prev_result())
    };
    let a = net.pod();
    let b = net.pod();
    let c = net.pod();
    let out = check(&a);
    assert!(out.success(), "{out:?}");

    // The host side of the plan: the route to the pod, its neighbour entry.
    let ip_c = c.ip().to_string();
    run_ok(std::process::Command::new("ip").args(["neigh", "del", &ip_c, "dev", &c.host_veth()]));
    check(&c).assert_error(102, &format!("no neighbour entry {ip_c}"));
    run_ok(std::process::Command::new("ip").args(["route", "del", &format!("{ip_c}/32")]));
    check(&c).assert_error(102, &format!("no route to {ip_c}/32"));

    a.netns.exec(&["ip", "addr", "flush", "dev", "eth0"]);
    check(&a).assert_error(102, &format!("address {}/24 is missing", a.ip()));

    run_ok(std::process::Command::new("ip").args(["link", "del", &b.host_veth()]));
    check(&b).assert_error(102, &format!("host veth {} of container", b.host_veth()));

    // `to_pod` off the host veth's egress (its pinned tcx link unpinned,
    // once ADD's work after the answer has made it).
    let d = net.pod();
    let veth = d.host_veth();
    wait_for_tcx(&veth);
    let pin = net
        .datapath()
        .link_path(flatnet_datapath::bpf::LinkRole::ToPod, &veth);
    std::fs::remove_file(&pin).expect("unpinning to_pod's link");
    wait_until("to_pod off the egress", Duration::from_secs(5), || {
        !tc_hooks(&veth).iter().any(|h| h.program == "to_pod")
    });
    check(&d).assert_error(102, &format!("host veth {veth} has no to_pod program"));

    // CHECK without prevResult is a configuration error.
    let out = CniCall::new("CHECK", &a.container_id, &a.netns.path(), "eth0")
        .run(&bin("flatnet"), &net.stdin());
    out.assert_error(7, "prevResult");
}

#[flatnet_test(root)]
fn add_whose_ipam_fails_leaves_nothing_behind() {
    // A /30 has one address besides the gateway: the second ADD must fail in IPAM.
    let net = Network::with_ipam(|subnet, gateway, dir| {
        let subnet = subnet.replace(".0/24", ".0/30");
        serde_json::json!({"type": "host-local", "subnet": subnet, "gateway": gateway, "dataDir": dir})
    });
    let first = net.pod();
    let endpoints_before = net.datapath().all_endpoints().unwrap();
    let netns = Netns::new();
    let out = net.call("ADD", "ipam-fails", &netns.path(), "eth0");
    assert!(!out.success(), "{out:?}");
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("IPAM plugin host-local"), "{msg}");
    assert!(
        !link_exists(&net.host_veth("ipam-fails", "eth0")),
        "veth left behind"
    );
    assert!(
        !netns.exec(&["ip", "-o", "link"]).contains("eth0"),
        "interface left in the pod"
    );
    assert_eq!(net.datapath().all_endpoints().unwrap(), endpoints_before);
    assert_eq!(net.ipam_allocations(), vec![first.ip().to_string()]);
}

#[flatnet_test(root)]
fn add_that_fails_after_ipam_gives_the_address_back() {
    let net = Network::host_local();
    let first = net.pod();
    // Same netns, same ifname, another container: the veth cannot be named eth0 there.
    let out = net.call("ADD", "second", &first.netns.path(), "eth0");
    out.assert_error(100, "already exists");
    assert!(!link_exists(&net.host_veth("second", "eth0")));
    assert_eq!(
        net.ipam_allocations(),
        vec![first.ip().to_string()],
        "address not given back"
    );
    assert_eq!(net.datapath().all_endpoints().unwrap().len(), 1);
}

#[flatnet_test(root)]
fn the_last_del_removes_the_networks_datapath_and_gateway() {
    let net = Network::host_local();
    let pod = net.pod();
    assert!(net.datapath().is_loaded(flatnet::config::DatapathMode::Tc));
    assert!(link_exists(&net.gateway_device));
    let gateway_index =
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", net.gateway_device)).unwrap();
    let veth = pod.host_veth();
    drop(pod);
    assert!(
        !net.datapath().exists(),
        "pins left at {}",
        net.datapath().pin_dir().display()
    );
    let lock_file = format!("/run/flatnet/network-{}.lock", net.name);
    assert!(
        !std::path::Path::new(&lock_file).exists(),
        "{lock_file} left behind"
    );
    // Renamed out of the way at once, so a new ADD builds a fresh one...
    assert!(
        !link_exists(&net.gateway_device),
        "gateway device still in use"
    );
    // ...and unregistered by the reaper, with the last veth.
    let retired = format!("flgone{:x}", gateway_index.trim().parse::<u32>().unwrap());
    assert!(
        wait_gone(&retired),
        "retired gateway {retired} was never removed"
    );
    assert!(wait_gone(&veth), "{veth} was never removed");
}

/// A pod whose veth went without its DEL (a crash, its netns deleted
/// first) must not keep the network for ever: the last live pod's DEL
/// sweeps it and takes the network away.
#[flatnet_test(root)]
fn a_pod_gone_without_its_del_does_not_keep_the_network() {
    let net = Network::host_local();
    let crashed = net.pod();
    let last = net.pod();
    let gone = crashed.host_veth();
    run_ok(std::process::Command::new("ip").args(["link", "del", &gone]));
    assert_eq!(net.datapath().host_veths().unwrap().len(), 2);
    drop(last);
    assert!(
        !net.datapath().exists(),
        "pins left at {} by a pod whose veth is gone",
        net.datapath().pin_dir().display()
    );
    assert!(!link_exists(&net.gateway_device), "gateway device left");
    // The runtime's DEL for it, when it comes, is a no-op that succeeds.
    let out = crashed.call("DEL");
    assert!(out.success(), "{out:?}");
}

#[flatnet_test(root)]
fn a_del_whose_ipam_is_missing_tears_down_the_rest_and_is_retried() {
    let net = Network::host_local();
    let pod = net.pod();
    let veth = pod.host_veth();
    let mut call = CniCall::new("DEL", &pod.container_id, &pod.netns.path(), &pod.ifname);
    call.path = "/nonexistent".into();
    call.run(&bin("flatnet"), &net.stdin())
        .assert_error(7, "host-local");
    // Everything but the address went: the pod, its veth, the network's
    // pins and gateway device (it was the last pod).
    assert!(down_or_gone(&veth), "{veth} still up");
    assert!(!net.datapath().exists(), "pins left after the last pod");
    assert!(!link_exists(&net.gateway_device), "gateway device left");
    assert_eq!(
        net.ipam_allocations().len(),
        1,
        "the address went without IPAM"
    );
    // The runtime's retry, with the plugin found, releases it.
    let out = pod.call("DEL");
    assert!(out.success(), "{out:?}");
    assert!(net.ipam_allocations().is_empty());
}

#[flatnet_test(root)]
fn maps_dump_with_field_names_in_bpftool() {
    let net = Network::host_local();
    let pod = net.pod();
    let dump = bpftool_ok(
        std::process::Command::new("bpftool")
            .args(["map", "dump", "pinned"])
            .arg(net.datapath().map_path("ENDPOINTS_V4")),
    );
    for field in ["host_ifindex", "pod_mac", "host_mac", "flags"] {
        assert!(dump.contains(field), "{field} missing from {dump}");
    }
    let octets = pod.ip().octets();
    assert!(
        dump.contains(&format!(
            "[{},{},{},{}",
            octets[0], octets[1], octets[2], octets[3]
        )),
        "{dump}"
    );
    let stats = bpftool_ok(
        std::process::Command::new("bpftool")
            .args(["map", "dump", "pinned"])
            .arg(net.datapath().map_path("STATS")),
    );
    assert!(
        stats.contains("\"packets\"") && stats.contains("\"bytes\""),
        "{stats}"
    );
}

#[flatnet_test(root)]
fn a_second_add_reuses_the_pinned_program() {
    let net = Network::host_local();
    let _a = net.pod();
    let first_id = net
        .datapath()
        .program(flatnet_common::PROG_FROM_POD)
        .unwrap()
        .id()
        .unwrap();
    let _b = net.pod();
    assert_eq!(
        net.datapath()
            .program(flatnet_common::PROG_FROM_POD)
            .unwrap()
            .id()
            .unwrap(),
        first_id,
        "the program was reloaded"
    );
}

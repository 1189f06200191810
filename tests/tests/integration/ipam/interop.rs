//! flatnet-ipam behind other plugins: the reference bridge plugin and
//! flatnet delegating to it give pods that talk.

use std::net::IpAddr;
use std::path::Path;

use flatnet_tests::*;
use serde_json::json;

use super::fixture::address_of;

/// A pod attached by the reference bridge plugin; DEL on drop.
struct BridgePod<'a> {
    net: &'a Network,
    netns: Netns,
    id: String,
    ip: std::net::Ipv4Addr,
}

impl<'a> BridgePod<'a> {
    fn add(net: &'a Network) -> Self {
        let netns = Netns::new();
        let id = unique("br-");
        let out = CniCall::new("ADD", &id, &netns.path(), "eth0")
            .run(Path::new("/usr/lib/cni/bridge"), &net.stdin());
        // Built before asserting, so a failed ADD is still deleted on drop.
        let ip = out
            .json()
            .get("ips")
            .map(|_| match address_of(&out.json(), 0) {
                IpAddr::V4(v4) => v4,
                IpAddr::V6(_) => panic!("IPv6 from an IPv4 config"),
            })
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
        let pod = BridgePod { net, netns, id, ip };
        assert!(out.success(), "bridge ADD failed: {out:?}");
        pod
    }
}

impl Drop for BridgePod<'_> {
    fn drop(&mut self) {
        let out = CniCall::new("DEL", &self.id, &self.netns.path(), "eth0")
            .run(Path::new("/usr/lib/cni/bridge"), &self.net.stdin());
        if !out.success() {
            eprintln!("cleanup DEL of {} failed: {out:?}", self.id);
        }
    }
}

#[flatnet_test(root)]
fn the_reference_bridge_plugin_delegating_to_flatnet_ipam_gives_pods_that_talk() {
    let mut net = Network::with_ipam(
        |subnet, gateway, dir| json!({"type": "flatnet-ipam", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
    );
    // Network's drop deletes `bridge` (the reference plugin's bridge here) and the data dir.
    net.conf["type"] = json!("bridge");
    net.conf["isGateway"] = json!(true);
    let a = BridgePod::add(&net);
    let b = BridgePod::add(&net);
    assert_ne!(a.ip, b.ip);
    assert_eq!(net.ipam_allocations().len(), 2);
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("a -> b");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), 1 << 20).expect("b -> a");
    // The gateway the bridge plugin put on its bridge came from flatnet-ipam's result.
    let addrs = run_ok(std::process::Command::new("ip").args([
        "-o",
        "addr",
        "show",
        "dev",
        &net.gateway_device,
    ]));
    assert!(addrs.contains(&format!("{}/24", net.gateway())), "{addrs}");
    drop((a, b));
    assert!(
        net.ipam_allocations().is_empty(),
        "bridge DEL released nothing"
    );
}

#[flatnet_test(root)]
fn flatnet_with_flatnet_ipam_gives_pods_that_talk() {
    let net = Network::with_ipam(
        |subnet, gateway, dir| json!({"type": "flatnet-ipam", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
    );
    let a = net.pod();
    let b = net.pod();
    assert_ne!(a.ip(), b.ip());
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 1 << 20).expect("a -> b");
    tcp_echo(Some(&a.netns), a.ip(), Some(&b.netns), 1 << 20).expect("b -> a");
    let mut allocated = net.ipam_allocations();
    allocated.sort();
    let mut expect = vec![a.ip().to_string(), b.ip().to_string()];
    expect.sort();
    assert_eq!(allocated, expect);
    let check = CniCall::new("CHECK", &a.container_id, &a.netns.path(), &a.ifname)
        .run(&bin("flatnet"), &a.stdin_with_prev_result());
    assert!(check.success(), "{check:?}");
    drop((a, b));
    assert!(
        net.ipam_allocations().is_empty(),
        "flatnet DEL released nothing"
    );
}

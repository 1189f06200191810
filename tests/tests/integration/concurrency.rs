//! 64 pods added at the same moment (one plugin process each, as kubelet
//! does), with flatnet + flatnet-ipam; pairs of them talk; then 64 DELs at
//! the same moment; nothing is left.

use std::collections::HashSet;
use std::time::Duration;

use flatnet_tests::*;

const PODS: usize = 64;

/// The pods of the test; any still attached are deleted on drop (a failed
/// assertion must not leak 64 veths).
struct Pods<'a> {
    net: &'a Network,
    pods: Vec<(Netns, String)>,
    deleted: bool,
}

impl Drop for Pods<'_> {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        for (netns, id) in &self.pods {
            let _ = self.net.call("DEL", id, &netns.path(), "eth0");
        }
    }
}

fn ip_of(result: &serde_json::Value) -> std::net::Ipv4Addr {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|ip| ip.parse().ok())
        .expect("an IPv4 address")
}

#[flatnet_test(root)]
fn sixty_four_pods_added_and_deleted_at_once() {
    let net = Network::flatnet_ipam();
    let flatnet = bin("flatnet");
    let mut pods = Pods {
        net: &net,
        pods: (0..PODS).map(|_| (Netns::new(), unique("ctr-"))).collect(),
        deleted: false,
    };

    // All 64 ADDs started before any is waited for.
    let children: Vec<_> = pods
        .pods
        .iter()
        .map(|(netns, id)| {
            CniCall::new("ADD", id, &netns.path(), "eth0").spawn(&flatnet, &net.stdin())
        })
        .collect();
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = CniOutput::from(child.wait_with_output().expect("wait for ADD"));
        if out.success() {
            results.push(out.json());
        } else {
            failures.push(format!("pod {i}: {out:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} ADDs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let ips: Vec<_> = results.iter().map(ip_of).collect();
    assert_eq!(
        ips.iter().collect::<HashSet<_>>().len(),
        PODS,
        "duplicate addresses: {ips:?}"
    );
    assert_eq!(net.ipam_allocations().len(), PODS);
    assert_eq!(net.datapath().host_veths().expect("HOST_VETHS").len(), PODS);
    assert_eq!(
        net.datapath().all_endpoints().expect("endpoints").len(),
        PODS
    );

    // Pairs across the whole set talk through the redirect.
    let before = net.redirected_bytes();
    for (a, b) in [
        (0, PODS - 1),
        (1, PODS - 2),
        (10, 20),
        (31, 32),
        (63, 0),
        (5, 45),
    ] {
        tcp_echo(
            Some(&pods.pods[b].0),
            ips[b],
            Some(&pods.pods[a].0),
            200_000,
        )
        .unwrap_or_else(|e| panic!("pod {a} -> pod {b}: {e}"));
    }
    // 6 pairs x 200 kB each way.
    assert!(net.redirected_bytes() > before + 6 * 400_000);

    let gateway_index =
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", net.gateway_device))
            .expect("gateway device")
            .trim()
            .parse::<u32>()
            .expect("ifindex");
    let veths: Vec<String> = pods
        .pods
        .iter()
        .map(|(_, id)| net.host_veth(id, "eth0"))
        .collect();

    // All 64 DELs at once.
    let children: Vec<_> = pods
        .pods
        .iter()
        .map(|(netns, id)| {
            CniCall::new("DEL", id, &netns.path(), "eth0").spawn(&flatnet, &net.stdin())
        })
        .collect();
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = CniOutput::from(child.wait_with_output().expect("wait for DEL"));
        if !out.success() {
            failures.push(format!("pod {i}: {out:?}"));
        }
    }
    pods.deleted = failures.is_empty();
    assert!(
        failures.is_empty(),
        "{} DELs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The reapers unregister the veths (and the gateway device) shortly after.
    for veth in &veths {
        assert!(wait_link_gone(veth, Duration::from_secs(20)), "{veth} left");
    }
    assert!(wait_link_gone(&net.gateway_device, Duration::from_secs(20)));
    assert!(
        wait_link_gone(&format!("flgone{gateway_index:x}"), Duration::from_secs(20)),
        "retired gateway device left"
    );
    assert!(
        net.ipam_allocations().is_empty(),
        "{:?}",
        net.ipam_allocations()
    );
    assert!(!net.datapath().exists(), "pins of {} left", net.name);
    let routes = run_ok(std::process::Command::new("ip").args(["route"]));
    assert!(
        !routes.contains(&format!("{}.", net.subnet_prefix)),
        "routes left: {routes}"
    );
}

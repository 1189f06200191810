//! flatnet in configuration lists with Debian's reference plugins
//! (containernetworking-plugins in /usr/lib/cni), run the way libcni runs a
//! list: ADD in order with each result as the next prevResult, CHECK with
//! the list's result, DEL in reverse order.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use flatnet_common::action;
use flatnet_tests::*;
use serde_json::{Value, json};

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// portmap leaves its top-level chains (CNI-HOSTPORT-*) and their jumps
/// behind after the last DEL, by design, and creates the nat tables of both
/// families (iptables-nft): a test must not leave them, so this puts each
/// nat table back the way it found it.
struct NatTableGuard {
    families: Vec<NatFamily>,
}

struct NatFamily {
    /// nftables family of the table iptables-nft uses ("ip", "ip6").
    nft: &'static str,
    iptables: &'static str,
    table_existed: bool,
    chains_before: Vec<String>,
}

impl NatFamily {
    fn new(nft: &'static str, iptables: &'static str) -> Self {
        let table = format!("table {nft} nat");
        NatFamily {
            nft,
            iptables,
            table_existed: sh("nft list tables").lines().any(|l| l.trim() == table),
            chains_before: Vec::new(),
        }
        .with_chains()
    }

    fn with_chains(mut self) -> Self {
        self.chains_before = self.chains();
        self
    }

    fn rules(&self) -> String {
        sh(&format!("{} -t nat -S", self.iptables))
    }

    fn chains(&self) -> Vec<String> {
        self.rules()
            .lines()
            .filter_map(|l| l.strip_prefix("-N "))
            .map(str::to_string)
            .collect()
    }

    fn restore(&self) {
        let only_cni = self
            .rules()
            .lines()
            .filter(|l| !l.starts_with("-P "))
            .all(|l| l.contains("CNI-"));
        if !self.table_existed && only_cni {
            let _ = Command::new("nft")
                .args(["delete", "table", self.nft, "nat"])
                .output();
            return;
        }
        let new: Vec<String> = self
            .chains()
            .into_iter()
            .filter(|c| !self.chains_before.contains(c))
            .collect();
        for rule in self.rules().lines().filter(|l| l.starts_with("-A ")) {
            if new.iter().any(|c| rule.split_whitespace().any(|w| w == c)) {
                // `-S` prints rules shell-quoted; `-D` takes the same words.
                let _ = Command::new("sh")
                    .args([
                        "-c",
                        &format!(
                            "{} -t nat {}",
                            self.iptables,
                            rule.replacen("-A ", "-D ", 1)
                        ),
                    ])
                    .output();
            }
        }
        for chain in &new {
            for flag in ["-F", "-X"] {
                let _ = Command::new(self.iptables)
                    .args(["-t", "nat", flag, chain])
                    .output();
            }
        }
    }
}

impl NatTableGuard {
    fn new() -> Self {
        NatTableGuard {
            families: vec![
                NatFamily::new("ip", "iptables"),
                NatFamily::new("ip6", "ip6tables"),
            ],
        }
    }
}

impl Drop for NatTableGuard {
    fn drop(&mut self) {
        for family in &self.families {
            family.restore();
        }
    }
}

/// A host port no one listens on now (in the range portmap tests use).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    listener.local_addr().expect("addr").port()
}

fn pod_ip(result: &Value) -> Ipv4Addr {
    let ip = result["ips"]
        .as_array()
        .and_then(|ips| ips.last())
        .and_then(|ip| ip["address"].as_str())
        .expect("an address");
    ip.split('/').next().unwrap().parse().expect("IPv4")
}

/// How long sending `bytes` from the host to a server in `ns` takes.
fn timed_host_to_pod(ns: &Netns, ip: Ipv4Addr, bytes: usize) -> Duration {
    let started = Instant::now();
    tcp_echo(Some(ns), ip, None, bytes).expect("host -> pod");
    started.elapsed()
}

fn qdiscs(dev: &str) -> String {
    sh(&format!("tc qdisc show dev {dev}"))
}

#[flatnet_test(root, tools = reference_plugins(&["portmap", "bandwidth", "tuning", "host-local"]))]
fn flatnet_portmap_bandwidth_tuning_add_check_del() {
    let _nat = NatTableGuard::new();
    let net = Network::flatnet_ipam();
    let list = shaping_list(
        &net,
        vec![
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
            json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            json!({"type": "tuning", "sysctl": {"net.core.somaxconn": "777"}}),
        ],
    );
    let netns = Netns::new();
    let id = unique("ctr-");
    let call = CniCall::new("ADD", &id, &netns.path(), "eth0");
    let host_port = free_port();
    // 4 Mbit/s into the pod (the bandwidth plugin's "ingress" = the host
    // veth's egress), burst 64 KiB.
    let runtime_config = json!({
        "portMappings": [{"hostPort": host_port, "containerPort": 8080, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 4_000_000, "ingressBurst": 524_288},
    });
    let mut attachment = ListAttachment::add(&list, call.clone(), runtime_config.clone())
        .expect("ADD through the list");
    let result = attachment.result.clone();
    let host_veth = net.host_veth(&id, "eth0");
    // Every plugin passed flatnet's result on.
    assert_eq!(
        result["interfaces"][0]["name"],
        host_veth.as_str(),
        "{result}"
    );
    assert_eq!(result["interfaces"][1]["name"], "eth0");
    let ip = pod_ip(&result);
    assert!(ip.to_string().starts_with(&net.subnet_prefix));

    // tuning: the sysctl is set in the pod's namespace.
    assert_eq!(
        netns.exec(&["sysctl", "-n", "net.core.somaxconn"]).trim(),
        "777"
    );

    // portmap: the host port reaches the pod, from the host's loopback and
    // from the node's own address in the pod network.
    let bind: SocketAddr = (Ipv4Addr::UNSPECIFIED, 8080).into();
    for target in [Ipv4Addr::LOCALHOST, net.gateway()] {
        tcp_echo_via(
            Some(&netns),
            bind,
            None,
            Some((target, host_port).into()),
            100_000,
        )
        .unwrap_or_else(|e| panic!("{target}:{host_port} -> pod:8080: {e}"));
    }

    // bandwidth: a tbf at 4 Mbit/s on the host veth, and it bites.
    let shown = qdiscs(&host_veth);
    assert!(shown.contains("tbf") && shown.contains("4Mbit"), "{shown}");
    let limited = timed_host_to_pod(&netns, ip, 1_000_000);
    // 1 MB at 4 Mbit/s is ~2 s (less the burst); unlimited it is milliseconds.
    let other = net.pod();
    let unlimited = timed_host_to_pod(&other.netns, other.ip(), 1_000_000);
    eprintln!("1 MB host -> pod: {limited:?} limited, {unlimited:?} without a limit");
    assert!(limited > Duration::from_millis(1200), "{limited:?}");
    assert!(limited > unlimited * 5, "{limited:?} vs {unlimited:?}");

    // Pod to pod as well: the datapath leaves packets for the shaped pod
    // to the stack, which sends them through the tbf.
    let shaped_before = net.action_packets(action::SHAPED);
    let started = Instant::now();
    tcp_echo(Some(&netns), ip, Some(&other.netns), 1_000_000).expect("pod -> pod");
    let pod_to_pod = started.elapsed();
    eprintln!("1 MB pod -> limited pod: {pod_to_pod:?}");
    assert!(pod_to_pod > Duration::from_millis(1200), "{pod_to_pod:?}");
    assert!(net.action_packets(action::SHAPED) > shaped_before);

    // portmap 1.1.1 CHECKs an IPv6 chain even for an IPv4-only pod
    // (containernetworking/plugins#819, fixed after 1.1.1): that one failure
    // is tolerated, everything else must pass.
    let tolerated = list
        .check_tolerating(&call, &runtime_config, &result, |e| {
            e.plugin == "portmap" && e.output.stdout.contains("could not check ipv6 dnat")
        })
        .expect("CHECK through the list");
    eprintln!("tolerated CHECK failures: {tolerated:?}");

    attachment.del().expect("DEL in reverse order");
    assert!(wait_link_gone(&host_veth, Duration::from_secs(10)));
    let nat = sh("iptables -t nat -S");
    assert!(!nat.contains(&format!("{ip}")), "portmap rules left: {nat}");
    assert_eq!(net.ipam_allocations(), vec![other.ip().to_string()]);
    // DEL again (a runtime retries) is fine for every plugin.
    list.del(&call, &runtime_config, Some(&result))
        .expect("second DEL");
}

/// flatnet declaring the `bandwidth` capability, as the bandwidth plugin
/// after it does: both read the same `runtimeConfig.bandwidth`, so flatnet
/// knows which pods' traffic must go through the qdiscs on their host veths.
fn shaping_list(net: &Network, more: Vec<Value>) -> Conflist {
    let mut flatnet = net.plugin_entry();
    flatnet["capabilities"] = json!({"bandwidth": true});
    let mut plugins = vec![flatnet];
    plugins.extend(more);
    Conflist::new(json!({"cniVersion": "1.0.0", "name": net.name, "plugins": plugins}))
}

/// The bandwidth plugin shapes a pod's egress with an `ingress` qdisc on
/// the host veth redirecting to an ifb device with a tbf. flatnet's tcx
/// program needs no qdisc of its own, so the plugin's ADD succeeds, and
/// hands the shaped pod's frames on ("next") for that qdisc to run: what
/// the pod sends, to another pod or to the host, is held to the rate.
#[flatnet_test(root, tools = reference_plugins(&["portmap", "bandwidth", "tuning", "host-local"]))]
fn bandwidth_egress_shaping_chains_and_limits_what_the_pod_sends() {
    let net = Network::flatnet_ipam();
    let list = shaping_list(
        &net,
        vec![json!({"type": "bandwidth", "capabilities": {"bandwidth": true}})],
    );
    let netns = Netns::new();
    let id = unique("ctr-");
    let call = CniCall::new("ADD", &id, &netns.path(), "eth0");
    // 4 Mbit/s out of the pod, burst 64 KiB.
    let runtime_config = json!({"bandwidth": {"egressRate": 4_000_000, "egressBurst": 524_288}});
    let mut attachment = ListAttachment::add(&list, call.clone(), runtime_config.clone())
        .expect("ADD with egress shaping after flatnet");
    let result = attachment.result.clone();
    // The bandwidth plugin's ifb device for this pod, named in its result.
    let ifbs = attachment.chained_devices();
    assert!(
        ifbs.len() == 1 && ifbs[0].starts_with("bwp") && link_exists(&ifbs[0]),
        "{result}"
    );
    let ip = pod_ip(&result);
    let host_veth = net.host_veth(&id, "eth0");
    let shown = qdiscs(&host_veth);
    assert!(shown.contains("qdisc ingress"), "{shown}");
    assert!(
        !shown.contains("clsact"),
        "flatnet needs no clsact: {shown}"
    );

    let other = net.pod();
    let third = net.pod();
    let shaped_before = net.action_packets(action::SHAPED);
    let timed = |server: &Netns, server_ip: Ipv4Addr, client: &Netns| {
        let started = Instant::now();
        tcp_echo(Some(server), server_ip, Some(client), 1_000_000).expect("a 1 MB echo");
        started.elapsed()
    };
    // The limited pod sends 1 MB (the echo back is not shaped).
    let limited = timed(&other.netns, other.ip(), &netns);
    let unlimited = timed(&other.netns, other.ip(), &third.netns);
    eprintln!("1 MB from the limited pod: {limited:?}; from another pod: {unlimited:?}");
    // 1 MB at 4 Mbit/s is ~2 s (less the burst); unlimited it is milliseconds.
    assert!(limited > Duration::from_millis(1200), "{limited:?}");
    assert!(limited > unlimited * 5, "{limited:?} vs {unlimited:?}");
    assert!(net.action_packets(action::SHAPED) > shaped_before);
    // The unshaped pods still take the redirect.
    let redirected = net.redirected_bytes();
    timed(&third.netns, third.ip(), &other.netns);
    assert!(net.redirected_bytes() > redirected + 1_000_000);

    // CHECK agrees (the datapath records the shaping), DEL cleans up.
    list.check(&call, &runtime_config, &result)
        .expect("CHECK of the shaped pod");
    attachment.del().expect("DEL in reverse order");
    assert!(wait_link_gone(&host_veth, Duration::from_secs(10)));
    let left: Vec<String> = net.ipam_allocations();
    assert!(!left.contains(&ip.to_string()), "{left:?}");
    assert!(
        !link_exists(&ifbs[0]),
        "this pod's ifb device {} was left",
        ifbs[0]
    );
}

#[flatnet_test(root, tools = reference_plugins(&["portmap", "bandwidth", "tuning", "host-local"]))]
fn flatnet_first_with_host_local_through_a_list() {
    let net = Network::host_local();
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let list = net.conflist(
            version,
            vec![json!({"type": "tuning", "sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}})],
        );
        let a_ns = Netns::new();
        let b_ns = Netns::new();
        let (a_id, b_id) = (unique("ctr-"), unique("ctr-"));
        let a_call = CniCall::new("ADD", &a_id, &a_ns.path(), "eth0");
        let b_call = CniCall::new("ADD", &b_id, &b_ns.path(), "eth0");
        let a = list.add(&a_call, &json!({})).expect("ADD a");
        let b = list.add(&b_call, &json!({})).expect("ADD b");
        assert_eq!(a["cniVersion"], version);
        assert_eq!(
            a_ns.exec(&["sysctl", "-n", "net.ipv4.conf.eth0.rp_filter"])
                .trim(),
            "2"
        );
        let before = net.redirected_bytes();
        tcp_echo(Some(&b_ns), pod_ip(&b), Some(&a_ns), 500_000).expect("a -> b");
        // 500 kB each way went through the redirect.
        assert!(net.redirected_bytes() > before + 1_000_000);
        // CHECK before 0.4.0 is not a thing; the list runner skips it as libcni does.
        list.check(&a_call, &json!({}), &a).expect("CHECK a");
        list.del(&a_call, &json!({}), Some(&a)).expect("DEL a");
        list.del(&b_call, &json!({}), Some(&b)).expect("DEL b");
        assert!(net.ipam_allocations().is_empty(), "{version}");
    }
}

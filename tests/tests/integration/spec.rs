//! Spec coverage of the flatnet plugin as a runtime drives it: every version
//! (result shapes), prevResult when flatnet runs later in a chain,
//! runtimeConfig/args/CNI_ARGS, CHECK per version, DNS, STATUS and GC.

use std::time::Duration;

use flatnet_tests::*;
use serde_json::{Value, json};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn flatnet_ipam_net(version: &str) -> Network {
    let mut net = Network::flatnet_ipam();
    net.conf["cniVersion"] = json!(version);
    net
}

fn stdin_of(conf: &Value) -> Vec<u8> {
    conf.to_string().into_bytes()
}

fn flatnet(call: &CniCall, conf: &Value) -> CniOutput {
    call.run(&bin("flatnet"), &stdin_of(conf))
}

fn pod_link_attr(ns: &Netns, ifname: &str, attr: &str) -> String {
    ns.exec(&["cat", &format!("/sys/class/net/{ifname}/{attr}")])
        .trim()
        .to_string()
}

#[flatnet_test(root)]
fn add_check_del_answer_in_every_version() {
    for version in VERSIONS {
        let mut net = flatnet_ipam_net(version);
        net.conf["mtu"] = json!(1400);
        let netns = Netns::new();
        let id = unique("ctr-");
        let add = CniCall::new("ADD", &id, &netns.path(), "eth0");
        let out = flatnet(&add, &net.conf);
        assert!(out.success(), "{version}: {out:?}");
        let result = out.json();
        assert_eq!(result["cniVersion"], version, "{result}");
        let ip = &result["ips"][0];
        assert!(
            ip["address"]
                .as_str()
                .unwrap()
                .starts_with(&net.subnet_prefix)
        );
        if version.starts_with("0.") {
            assert_eq!(ip["version"], "4", "{version}: {result}");
        } else {
            assert!(ip.get("version").is_none(), "{version}: {result}");
        }
        assert_eq!(ip["interface"], 1, "{result}");
        assert_eq!(result["interfaces"][1]["name"], "eth0");
        assert_eq!(
            result["interfaces"][1]["sandbox"],
            netns.path().display().to_string()
        );
        // Interface mtu is a 1.1.0 result field.
        assert_eq!(
            result["interfaces"][1].get("mtu").cloned(),
            (version == "1.1.0").then(|| json!(1400)),
            "{version}: {result}"
        );
        assert_eq!(pod_link_attr(&netns, "eth0", "mtu"), "1400");

        let mut with_prev = net.conf.clone();
        with_prev["prevResult"] = result.clone();
        let mut check = add.clone();
        check.command = "CHECK".into();
        let out = flatnet(&check, &with_prev);
        if version.starts_with("0.3") {
            out.assert_error(1, "CHECK");
        } else {
            assert!(out.success(), "{version}: {out:?}");
        }
        let mut del = add.clone();
        del.command = "DEL".into();
        let out = flatnet(&del, &with_prev);
        assert!(out.success(), "{version}: {out:?}");
        assert!(out.stdout.trim().is_empty(), "DEL prints nothing: {out:?}");
        assert!(net.ipam_allocations().is_empty(), "{version}");
    }
}

#[flatnet_test]
fn version_answers_in_the_asked_version_and_unknown_versions_get_code_1() {
    for version in VERSIONS {
        let call = CniCall {
            command: "VERSION".into(),
            ..Default::default()
        };
        let out = call.run(&bin("flatnet"), &stdin_of(&json!({"cniVersion": version})));
        assert!(out.success(), "{out:?}");
        assert_eq!(out.json()["cniVersion"], version);
        assert_eq!(out.json()["supportedVersions"], json!(VERSIONS));
    }
    let netns = std::path::Path::new("/proc/self/ns/net");
    for bad in [
        json!("2.0.0"),
        json!("1.0"),
        json!(""),
        json!("0.2.0"),
        json!(1),
    ] {
        let conf = json!({"cniVersion": bad, "name": "n", "type": "flatnet", "ipam": {"type": "flatnet-ipam"}});
        let out = flatnet(&CniCall::new("ADD", "c", netns, "eth0"), &conf);
        if bad.is_string() {
            out.assert_error(1, "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0");
        } else {
            out.assert_error(6, "network configuration");
        }
    }
}

#[flatnet_test(root)]
fn flatnet_later_in_a_chain_keeps_the_earlier_result_and_appends_its_own() {
    for version in ["0.4.0", "1.0.0"] {
        let net = flatnet_ipam_net(version);
        let netns = Netns::new();
        // What an earlier plugin left in the pod, and reported.
        // (No dummy driver in every kernel: a veth pair inside the pod.)
        netns.exec(&[
            "ip", "link", "add", "net1", "type", "veth", "peer", "name", "net1p",
        ]);
        netns.exec(&["ip", "addr", "add", "192.0.2.10/24", "dev", "net1"]);
        netns.exec(&["ip", "link", "set", "net1", "up"]);
        netns.exec(&["ip", "route", "add", "198.51.100.0/24", "via", "192.0.2.1"]);
        let sandbox = netns.path().display().to_string();
        let earlier = json!({
            "cniVersion": version,
            "interfaces": [{"name": "hostside0"}, {"name": "net1", "sandbox": sandbox}],
            // The second IP names no interface (the spec allows it): not
            // flatnet's, so CHECK must not look for it on eth0.
            "ips": [
                {"version": "4", "address": "192.0.2.10/24", "gateway": "192.0.2.1", "interface": 1},
                {"version": "4", "address": "192.0.2.11/24"}
            ],
            "routes": [{"dst": "198.51.100.0/24", "gw": "192.0.2.1"}],
            "dns": {"nameservers": ["192.0.2.53"], "search": ["earlier.example"]}
        });
        let mut conf = net.conf.clone();
        conf["prevResult"] = earlier.clone();
        let id = unique("ctr-");
        let add = CniCall::new("ADD", &id, &netns.path(), "eth0");
        let out = flatnet(&add, &conf);
        assert!(out.success(), "{out:?}");
        let result = out.json();
        let names: Vec<&str> = result["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec!["hostside0", "net1", &net.host_veth(&id, "eth0"), "eth0"]
        );
        assert_eq!(result["ips"][0]["address"], "192.0.2.10/24");
        assert_eq!(result["ips"][0]["interface"], 1);
        assert_eq!(result["ips"][1]["address"], "192.0.2.11/24");
        assert!(
            result["ips"][2]["address"]
                .as_str()
                .unwrap()
                .starts_with(&net.subnet_prefix)
        );
        assert_eq!(
            result["ips"][2]["interface"], 3,
            "shifted past 2 earlier interfaces"
        );
        assert_eq!(result["routes"][0]["dst"], "198.51.100.0/24");
        assert!(
            result["routes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["dst"] == "0.0.0.0/0"),
            "{result}"
        );
        assert_eq!(result["dns"], earlier["dns"]);
        // The earlier IP is written in the config's version too.
        let expected_version = version.starts_with("0.").then(|| json!("4"));
        assert_eq!(result["ips"][0].get("version").cloned(), expected_version);

        // CHECK and DEL with the merged result, as a runtime passes it.
        conf["prevResult"] = result;
        let mut call = add.clone();
        call.command = "CHECK".into();
        let out = flatnet(&call, &conf);
        assert!(out.success(), "{out:?}");
        call.command = "DEL".into();
        let out = flatnet(&call, &conf);
        assert!(out.success(), "{out:?}");
        // The earlier plugin's interface is not flatnet's to remove.
        assert!(netns.exec(&["ip", "-o", "link"]).contains("net1"));
    }
}

#[flatnet_test(root)]
fn runtime_config_mtu_mac_and_ips_reach_the_pod() {
    let mut net = flatnet_ipam_net("1.0.0");
    net.conf["mtu"] = json!(1500);
    net.conf["capabilities"] = json!({"mtu": true, "mac": true, "ips": true});
    let list = net.conflist("1.0.0", Vec::new());
    let netns = Netns::new();
    let id = unique("ctr-");
    let call = CniCall::new("ADD", &id, &netns.path(), "eth0");
    let wanted_ip = format!("{}.77", net.subnet_prefix);
    let runtime_config = json!({
        "mtu": 1400,
        "mac": "02:aa:bb:cc:dd:ee",
        "ips": [format!("{wanted_ip}/24")],
        "portMappings": [{"hostPort": 1, "containerPort": 1}]
    });
    let result = list.add(&call, &runtime_config).expect("ADD");
    assert_eq!(result["ips"][0]["address"], format!("{wanted_ip}/24"));
    assert_eq!(result["interfaces"][1]["mac"], "02:aa:bb:cc:dd:ee");
    assert_eq!(pod_link_attr(&netns, "eth0", "mtu"), "1400");
    assert_eq!(
        pod_link_attr(&netns, "eth0", "address"),
        "02:aa:bb:cc:dd:ee"
    );
    let host_veth = net.host_veth(&id, "eth0");
    assert_eq!(
        std::fs::read_to_string(format!("/sys/class/net/{host_veth}/mtu"))
            .unwrap()
            .trim(),
        "1400"
    );
    list.check(&call, &runtime_config, &result).expect("CHECK");
    // The datapath delivers to the chosen MAC: a second pod reaches it.
    let other = net.pod();
    tcp_echo(
        Some(&netns),
        wanted_ip.parse::<std::net::Ipv4Addr>().unwrap(),
        Some(&other.netns),
        200_000,
    )
    .expect("pod with a runtime MAC is reachable");
    drop(other);
    list.del(&call, &runtime_config, Some(&result))
        .expect("DEL");
    assert!(wait_link_gone(&host_veth, Duration::from_secs(10)));

    // A bad MAC is refused before anything is made.
    let bad = json!({"mac": "01:00:5e:00:00:01"});
    let err = list.add(&call, &bad).expect_err("multicast MAC");
    err.output.assert_error(7, "runtimeConfig.mac");
    let bad = json!({"mtu": 20});
    let err = list.add(&call, &bad).expect_err("tiny MTU");
    err.output.assert_error(7, "runtimeConfig.mtu");
    assert!(!link_exists(&host_veth));
    assert!(net.ipam_allocations().is_empty());
}

#[flatnet_test(root)]
fn cni_args_ip_mac_and_ignore_unknown() {
    let net = flatnet_ipam_net("1.0.0");
    let netns = Netns::new();
    let id = unique("ctr-");
    let mut call = CniCall::new("ADD", &id, &netns.path(), "eth0");
    call.args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;FOO=bar".into();
    flatnet(&call, &net.conf).assert_error(2, "FOO");
    call.args = "IgnoreUnknown=maybe;FOO=bar".into();
    flatnet(&call, &net.conf).assert_error(4, "IgnoreUnknown");
    call.args = "MAC=zz".into();
    flatnet(&call, &net.conf).assert_error(4, "MAC=zz");
    assert!(!link_exists(&net.host_veth(&id, "eth0")));
    assert!(net.ipam_allocations().is_empty());

    let ip = format!("{}.66", net.subnet_prefix);
    call.args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;FOO=bar;IP={ip};MAC=02:01:02:03:04:05"
    );
    let out = flatnet(&call, &net.conf);
    assert!(out.success(), "{out:?}");
    let result = out.json();
    assert_eq!(result["ips"][0]["address"], format!("{ip}/24"));
    assert_eq!(
        pod_link_attr(&netns, "eth0", "address"),
        "02:01:02:03:04:05"
    );
    // args.cni.mac beats CNI_ARGS MAC=, runtimeConfig.mac beats both (unit
    // tested); a DEL never refuses CNI_ARGS.
    call.command = "DEL".into();
    call.args = "SOMETHING=else;not-a-pair".into();
    let out = flatnet(&call, &net.conf);
    assert!(out.success(), "{out:?}");
    assert!(net.ipam_allocations().is_empty());
}

#[flatnet_test(root)]
fn dns_from_the_config_is_returned_in_every_version() {
    let dns = json!({"nameservers": ["10.96.0.10", "fd00::10"], "domain": "cluster.local", "search": ["svc.cluster.local"], "options": ["ndots:5"]});
    for version in ["0.3.1", "1.0.0", "1.1.0"] {
        let mut net = flatnet_ipam_net(version);
        net.conf["dns"] = dns.clone();
        let pod = net.pod();
        assert_eq!(pod.result["dns"], dns, "{version}");
    }
}

fn status_call() -> CniCall {
    CniCall {
        command: "STATUS".into(),
        path: cni_path(),
        ..Default::default()
    }
}

#[flatnet_test(root)]
fn status_is_ready_only_when_the_datapath_and_the_ipam_are() {
    let mut net = flatnet_ipam_net("1.1.0");
    let out = flatnet(&status_call(), &net.conf);
    assert!(out.success(), "{out:?}");
    assert!(out.stdout.trim().is_empty(), "{out:?}");

    // Older versions have no STATUS.
    for version in ["0.4.0", "1.0.0"] {
        let mut conf = net.conf.clone();
        conf["cniVersion"] = json!(version);
        flatnet(&status_call(), &conf).assert_error(1, "STATUS");
        let mut gc = status_call();
        gc.command = "GC".into();
        conf["cni.dev/valid-attachments"] = json!([]);
        flatnet(&gc, &conf).assert_error(1, "GC");
    }
    // An IPAM plugin that is not there, or cannot do 1.1.0 (host-local 1.1.1).
    let mut conf = net.conf.clone();
    conf["ipam"]["type"] = json!("no-such-ipam");
    flatnet(&status_call(), &conf).assert_error(50, "no-such-ipam");
    let mut conf = net.conf.clone();
    conf["ipam"] = json!({"type": "host-local", "subnet": "10.254.0.0/24"});
    flatnet(&status_call(), &conf).assert_error(50, "host-local");
    // A gateway device that another network owns.
    let other = flatnet_ipam_net("1.1.0");
    let _other_pod = other.pod();
    let mut conf = net.conf.clone();
    conf["bridge"] = json!(other.gateway_device);
    flatnet(&status_call(), &conf).assert_error(50, &other.name);

    // A full pool: the IPAM's STATUS says so, and flatnet passes it on.
    let last = format!("{}.2", net.subnet_prefix);
    net.conf["ipam"]["rangeStart"] = json!(last);
    net.conf["ipam"]["rangeEnd"] = json!(last);
    let pod = net.pod();
    let out = flatnet(&status_call(), &net.conf);
    out.assert_error(50, "flatnet-ipam");
    drop(pod);
    let out = flatnet(&status_call(), &net.conf);
    assert!(out.success(), "{out:?}");
}

fn gc(net: &Network, valid: &[(&str, &str)]) -> CniOutput {
    let mut conf = net.conf.clone();
    conf["cni.dev/valid-attachments"] = json!(
        valid
            .iter()
            .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
            .collect::<Vec<_>>()
    );
    let mut call = status_call();
    call.command = "GC".into();
    flatnet(&call, &conf)
}

fn endpoint_count(net: &Network) -> usize {
    net.datapath()
        .all_endpoints()
        .map(|all| all.len())
        .unwrap_or(0)
}

#[flatnet_test(root)]
fn gc_removes_what_no_valid_attachment_owns() {
    let net = flatnet_ipam_net("1.1.0");
    // a and b with a hostPort each (flatnet's BPF hostPorts).
    let host_port = |port: u16| json!({"portMappings": [{"hostPort": port, "containerPort": 80}]});
    let a = net.pod_with_runtime_config(host_port(31001));
    let b = net.pod_with_runtime_config(host_port(31002));
    let c = net.pod();
    let d = net.pod();
    assert_eq!(net.ipam_allocations().len(), 4);
    assert_eq!(endpoint_count(&net), 4);
    let held = net.datapath().host_ports();
    assert_eq!(held.len(), 2, "{held:?}");

    // d's namespace goes away behind the runtime's back: its veth goes with
    // it and its datapath entry points at a vanished ifindex.
    let d_veth = d.host_veth();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &d.netns.name])
        .output();
    assert!(wait_link_gone(&d_veth, Duration::from_secs(10)));

    // a is valid; d is still valid by name (its address stays), b and c not.
    let out = gc(
        &net,
        &[(&a.container_id, "eth0"), (&d.container_id, "eth0")],
    );
    assert!(out.success(), "{out:?}");
    assert!(link_exists(&a.host_veth()));
    assert!(!link_exists(&b.host_veth()));
    assert!(!link_exists(&c.host_veth()));
    assert!(!b.netns.exec(&["ip", "-o", "link"]).contains("eth0"));
    let ips: Vec<String> = net.ipam_allocations();
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(ips.contains(&a.ip().to_string()) && ips.contains(&d.ip().to_string()));
    let left: Vec<_> = net.datapath().all_endpoints().unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, std::net::IpAddr::V4(a.ip()));
    assert_eq!(net.datapath().host_veths().unwrap().len(), 1);
    // b's hostPort went with it, a's stays.
    let held = net.datapath().host_ports();
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        [&a.host_veth()],
        "{held:?}"
    );
    let ports: Vec<u16> = net
        .datapath()
        .service_frontends()
        .unwrap()
        .iter()
        .map(|(key, _)| flatnet_datapath::bpf::frontend_of(key).1)
        .collect();
    assert!(
        ports.contains(&31001) && !ports.contains(&31002),
        "{ports:?}"
    );
    // a still works.
    tcp_echo(Some(&a.netns), a.ip(), None, 100_000).expect("host -> a after GC");

    // Past a failure (the IPAM plugin is gone) GC still removes the veths
    // and says what failed.
    let mut broken = net.conf.clone();
    broken["ipam"]["type"] = json!("no-such-ipam");
    broken["cni.dev/valid-attachments"] = json!([]);
    let mut call = status_call();
    call.command = "GC".into();
    let out = flatnet(&call, &broken);
    out.assert_error(7, "no-such-ipam");
    assert!(!link_exists(&a.host_veth()));
    // Nothing valid at all: the network's pins and gateway device go too.
    let out = gc(&net, &[]);
    assert!(out.success(), "{out:?}");
    assert!(net.ipam_allocations().is_empty());
    assert!(!net.datapath().exists(), "pins left");
    assert!(
        net.datapath().host_ports().is_empty(),
        "hostPort records left"
    );
    assert!(wait_link_gone(&net.gateway_device, Duration::from_secs(10)));

    // A GC without the list is refused rather than read as "nothing valid".
    let mut conf = net.conf.clone();
    conf["cni.dev/valid-attachments"] = Value::Null;
    let mut call = status_call();
    call.command = "GC".into();
    flatnet(&call, &conf).assert_error(7, "cni.dev/valid-attachments");
}

#[flatnet_test(root)]
fn a_list_with_cni_versions_runs_at_the_newest_known_one() {
    let net = flatnet_ipam_net("1.0.0");
    let mut list = net.conflist("1.0.0", Vec::new());
    // 1.1.0 lists may offer several versions; the runtime picks the newest
    // it knows (9.9.9 is nobody's).
    list.list["cniVersions"] = json!(["0.4.0", "1.1.0", "1.0.0", "9.9.9"]);
    assert_eq!(list.version(), "1.1.0");
    let netns = Netns::new();
    let id = unique("ctr-");
    let call = CniCall::new("ADD", &id, &netns.path(), "eth0");
    let result = list.add(&call, &json!({})).expect("ADD");
    assert_eq!(result["cniVersion"], "1.1.0");
    list.check(&call, &json!({}), &result).expect("CHECK");
    list.status(&status_call())
        .expect("STATUS through the list");
    // GC through the list with this pod still valid keeps it, without it removes it.
    list.gc(&status_call(), &[(&id, "eth0")])
        .expect("GC keeping the pod");
    assert!(link_exists(&net.host_veth(&id, "eth0")));
    list.gc(&status_call(), &[]).expect("GC of everything");
    assert!(!link_exists(&net.host_veth(&id, "eth0")));
    assert!(net.ipam_allocations().is_empty());
    // DEL after GC is still fine (idempotent).
    list.del(&call, &json!({}), Some(&result)).expect("DEL");
}

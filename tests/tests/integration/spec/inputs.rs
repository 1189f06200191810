//! What a runtime passes besides the config reaches the pod: a prevResult
//! when flatnet runs later in a chain is kept and appended to, and
//! runtimeConfig, args and CNI_ARGS set the MTU, MAC and IPs.

use std::time::Duration;

use flatnet_tests::*;
use serde_json::json;

use super::fixture::{flatnet, flatnet_ipam_net, pod_link_attr};

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

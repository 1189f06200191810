//! Every CNI version: ADD, CHECK and DEL answer in each (result shapes),
//! VERSION answers in the asked one and unknown ones get code 1, DNS is
//! returned in each, and a list with `cniVersions` runs at the newest
//! known one.

use flatnet_tests::*;
use serde_json::json;

use super::fixture::{flatnet, flatnet_ipam_net, pod_link_attr, status_call, stdin_of};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

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
fn dns_from_the_config_is_returned_in_every_version() {
    let dns = json!({"nameservers": ["10.96.0.10", "fd00::10"], "domain": "cluster.local", "search": ["svc.cluster.local"], "options": ["ndots:5"]});
    for version in ["0.3.1", "1.0.0", "1.1.0"] {
        let mut net = flatnet_ipam_net(version);
        net.conf["dns"] = dns.clone();
        let pod = net.pod();
        assert_eq!(pod.result["dns"], dns, "{version}");
    }
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

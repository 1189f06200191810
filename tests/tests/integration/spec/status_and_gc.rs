//! STATUS is ready only when the datapath and the IPAM are, and GC removes
//! what no valid attachment owns.

use std::time::Duration;

use flatnet_tests::*;
use serde_json::{Value, json};

use super::fixture::{flatnet, flatnet_ipam_net, gc, status_call};

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

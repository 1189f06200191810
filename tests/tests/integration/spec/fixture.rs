//! What the spec tests share: a flatnet network at a CNI version, a call
//! of the flatnet plugin, a pod link's attribute, and STATUS and GC calls.

use flatnet_tests::*;
use serde_json::{Value, json};

pub(super) fn flatnet_ipam_net(version: &str) -> Network {
    let mut net = Network::flatnet_ipam();
    net.conf["cniVersion"] = json!(version);
    net
}

pub(super) fn stdin_of(conf: &Value) -> Vec<u8> {
    conf.to_string().into_bytes()
}

pub(super) fn flatnet(call: &CniCall, conf: &Value) -> CniOutput {
    call.run(&bin("flatnet"), &stdin_of(conf))
}

pub(super) fn pod_link_attr(ns: &Netns, ifname: &str, attr: &str) -> String {
    ns.exec(&["cat", &format!("/sys/class/net/{ifname}/{attr}")])
        .trim()
        .to_string()
}

pub(super) fn status_call() -> CniCall {
    CniCall {
        command: "STATUS".into(),
        path: cni_path(),
        ..Default::default()
    }
}

pub(super) fn gc(net: &Network, valid: &[(&str, &str)]) -> CniOutput {
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

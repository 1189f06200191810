//! The flatnet network of one test (unique name, /24, gateway device,
//! IPAM dir) and the pods attached to it.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::netlink::AttachmentNames;
use serde_json::{Value, json};

use crate::{CniCall, CniOutput, Conflist, Netns, bin, forwarding, result_ips, unique};

fn unique_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A flatnet network of one test: unique name, /24, gateway device and IPAM
/// state; everything it may leave on the node is removed on drop.
pub struct Network {
    pub name: String,
    pub gateway_device: String,
    pub subnet_prefix: String,
    pub ipam_dir: PathBuf,
    pub conf: Value,
    /// Removed should a signal end the process (`remove_on_signal`).
    listed: Option<crate::Listed>,
}

impl Network {
    /// flatnet with the reference host-local IPAM on a fresh /24.
    pub fn host_local() -> Self {
        Self::with_ipam(
            |subnet, gateway, dir| json!({"type": "host-local", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
        )
    }

    /// flatnet with an IPAM section built from (subnet, gateway, data dir).
    pub fn with_ipam(ipam: impl FnOnce(&str, &str, &str) -> Value) -> Self {
        forwarding::pristine_host();
        let n = unique_number();
        // One /24 per network of this process: the second octet moves on
        // every 250 (the one test binary makes more than that in a run).
        let second = 100 + (std::process::id() + n / 250) % 100;
        let prefix = format!("10.{second}.{}", n % 250);
        let name = unique("ft-net-");
        let ipam_dir = std::env::temp_dir().join(format!("flatnet-test-ipam-{name}"));
        let subnet = format!("{prefix}.0/24");
        let gateway = format!("{prefix}.1");
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": name,
            "type": "flatnet",
            "bridge": unique("flg"),
            "ipam": ipam(&subnet, &gateway, &ipam_dir.display().to_string()),
        });
        let gateway_device = conf["bridge"].as_str().unwrap_or_default().to_string();
        let listed = {
            let (name, gateway_device, ipam_dir) =
                (name.clone(), gateway_device.clone(), ipam_dir.clone());
            crate::made_here(move || remove_network(&name, &gateway_device, &ipam_dir))
        };
        Network {
            gateway_device,
            name,
            subnet_prefix: prefix,
            ipam_dir,
            conf,
            listed: Some(listed),
        }
    }

    pub fn gateway(&self) -> Ipv4Addr {
        format!("{}.1", self.subnet_prefix)
            .parse()
            .expect("gateway")
    }

    pub fn stdin(&self) -> Vec<u8> {
        self.conf.to_string().into_bytes()
    }

    pub fn datapath(&self) -> Datapath {
        Datapath::new(&self.name)
    }

    pub fn call(&self, command: &str, container_id: &str, netns: &Path, ifname: &str) -> CniOutput {
        CniCall::new(command, container_id, netns, ifname).run(&bin("flatnet"), &self.stdin())
    }

    /// A new pod attached with ADD (panics if ADD fails); DEL on drop.
    pub fn pod(&self) -> Pod<'_> {
        self.pod_with_stdin(self.stdin())
    }

    /// A pod whose ADD gets `runtime_config` (as a runtime passes the
    /// capabilities the conf declares).
    pub fn pod_with_runtime_config(&self, runtime_config: serde_json::Value) -> Pod<'_> {
        let mut conf = self.conf.clone();
        conf["runtimeConfig"] = runtime_config;
        self.pod_with_stdin(conf.to_string().into_bytes())
    }

    fn pod_with_stdin(&self, stdin: Vec<u8>) -> Pod<'_> {
        let netns = Netns::new();
        let container_id = unique("ctr-");
        let out =
            CniCall::new("ADD", &container_id, &netns.path(), "eth0").run(&bin("flatnet"), &stdin);
        assert!(out.success(), "ADD failed: {out:?}");
        let result = out.json();
        Pod {
            network: self,
            netns,
            container_id,
            ifname: "eth0".into(),
            result,
        }
    }

    pub fn host_veth(&self, container_id: &str, ifname: &str) -> String {
        AttachmentNames::new(&self.name, container_id, ifname).host_veth
    }

    /// Allocation records host-local keeps (files named by address).
    pub fn ipam_allocations(&self) -> Vec<String> {
        let dir = self.ipam_dir.join(&self.name);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    pub fn redirected_packets(&self) -> u64 {
        self.datapath().stats().expect("STATS")[flatnet_common::action::REDIRECTED as usize].packets
    }

    /// Bytes the datapath redirected: on veths, segments are GSO-sized, so
    /// a transfer's packet count says little; its bytes do.
    pub fn redirected_bytes(&self) -> u64 {
        self.datapath().stats().expect("STATS")[flatnet_common::action::REDIRECTED as usize].bytes
    }

    pub fn action_packets(&self, action: u32) -> u64 {
        self.datapath().stats().expect("STATS")[action as usize].packets
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        remove_network(&self.name, &self.gateway_device, &self.ipam_dir);
        if let Some(listed) = self.listed.take() {
            listed.removed();
        }
    }
}

/// What network `name` may leave on the node, removed.
fn remove_network(name: &str, gateway_device: &str, ipam_dir: &Path) {
    let _ = Command::new("ip")
        .args(["link", "del", gateway_device])
        .output();
    let datapath = Datapath::new(name);
    let _ = datapath.remove_pins();
    // The pin root goes with the last network in it (remove_dir leaves
    // one that still holds another's pins).
    let _ = std::fs::remove_dir(datapath.root());
    let _ = std::fs::remove_dir_all(ipam_dir);
    // The plugin keeps a network's lock file (deleting a lock others may
    // wait on is unsafe); a test network is the test's alone.
    let _ = std::fs::remove_file(format!(
        "{}/{}.lock",
        flatnet_datapath::lock::LOCK_DIR,
        flatnet_datapath::lock::network(name)
    ));
}

/// A pod: its namespace and ADD result; DEL is called on drop.
pub struct Pod<'a> {
    pub network: &'a Network,
    pub netns: Netns,
    pub container_id: String,
    pub ifname: String,
    pub result: Value,
}

impl Pod<'_> {
    pub fn ip(&self) -> Ipv4Addr {
        match result_ips(&self.result).first() {
            Some(IpAddr::V4(ip)) => *ip,
            other => panic!("the pod's first address is not IPv4: {other:?}"),
        }
    }

    /// The pod's IPv6 (`v6`) or IPv4 address.
    pub fn address(&self, v6: bool) -> IpAddr {
        result_ips(&self.result)
            .into_iter()
            .find(|ip| ip.is_ipv6() == v6)
            .unwrap_or_else(|| {
                panic!(
                    "no IPv{} address in {}",
                    if v6 { 6 } else { 4 },
                    self.result
                )
            })
    }

    pub fn host_veth(&self) -> String {
        self.network.host_veth(&self.container_id, &self.ifname)
    }

    pub fn call(&self, command: &str) -> CniOutput {
        self.network.call(
            command,
            &self.container_id,
            &self.netns.path(),
            &self.ifname,
        )
    }

    /// The network config with this pod's ADD result as prevResult.
    pub fn stdin_with_prev_result(&self) -> Vec<u8> {
        let mut conf = self.network.conf.clone();
        conf["prevResult"] = self.result.clone();
        conf.to_string().into_bytes()
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let out = self.call("DEL");
        if !out.success() {
            eprintln!("cleanup DEL of {} failed: {out:?}", self.container_id);
        }
    }
}

impl Network {
    /// This network's flatnet configuration as an entry of a list (without
    /// the `name` and `cniVersion` the list gives it).
    pub fn plugin_entry(&self) -> Value {
        let mut entry = self.conf.clone();
        if let Some(map) = entry.as_object_mut() {
            map.remove("name");
            map.remove("cniVersion");
        }
        entry
    }

    /// A list with flatnet first and `more` after it.
    pub fn conflist(&self, cni_version: &str, more: Vec<Value>) -> Conflist {
        let mut plugins = vec![self.plugin_entry()];
        plugins.extend(more);
        Conflist::new(json!({"cniVersion": cni_version, "name": self.name, "plugins": plugins}))
    }

    /// flatnet with flatnet-ipam on a fresh /24.
    pub fn flatnet_ipam() -> Self {
        Self::with_ipam(
            |subnet, gateway, dir| json!({"type": "flatnet-ipam", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
        )
    }

    /// Dual stack in datapath `mode`: a fresh /24 and a matching /64,
    /// flatnet-ipam handing out one address of each.
    pub fn dual_stack(mode: &str) -> Self {
        let mut net = Self::with_ipam(|subnet, gateway, dir| {
            let octets: Vec<u32> = subnet
                .split(['.', '/'])
                .filter_map(|p| p.parse().ok())
                .collect();
            let v6 = format!("fd42:{:x}:{:x}::", octets[1], octets[2]);
            json!({
                "type": "flatnet-ipam",
                "ranges": [
                    [{"subnet": subnet, "gateway": gateway}],
                    [{"subnet": format!("{v6}/64"), "gateway": format!("{v6}1")}]
                ],
                "dataDir": dir
            })
        });
        net.conf["datapath"] = json!(mode);
        net
    }
}

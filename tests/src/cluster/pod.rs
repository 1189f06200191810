//! The installed plugin run on a node as a runtime runs it, and
//! [`SimPod`], a pod it attached.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use serde_json::Value;

use super::SimNode;
use crate::{CniCall, CniOutput, Conflist, Netns, result_ips, unique};

impl SimNode {
    /// The flatnet plugin's stdin as a runtime builds it from the conflist.
    pub fn plugin_stdin(&self) -> Vec<u8> {
        let mut cached = self.plugin_stdin.lock().unwrap();
        if self.conflist_path().exists() || cached.is_none() {
            let stdin = Conflist::new(self.conflist()).first_plugin_conf();
            *cached = Some(stdin.to_string().into_bytes());
        }
        cached.clone().expect("plugin stdin")
    }

    /// Runs the installed plugin on this node as a runtime would: with the
    /// CNI variables only (the pin root comes from the conflist).
    pub fn cni(&self, command: &str, container: Option<(&str, &Path)>) -> CniOutput {
        self.cni_with_env(command, container, &[])
    }

    /// `cni`, with more environment for the plugin.
    pub fn cni_with_env(
        &self,
        command: &str,
        container: Option<(&str, &Path)>,
        env: &[(&str, &Path)],
    ) -> CniOutput {
        let mut call = match container {
            Some((id, netns)) => CniCall::new(command, id, netns, "eth0"),
            None => CniCall {
                command: command.into(),
                ..CniCall::default()
            },
        };
        call.path = self.bin_dir().display().to_string();
        call.node = Some(self.netns.path());
        call.env = env
            .iter()
            .map(|(key, value)| (key.to_string(), value.as_os_str().to_owned()))
            .collect();
        let mut stdin = self.plugin_stdin();
        if matches!(command, "STATUS" | "GC") {
            // Verbs of CNI 1.1.0, which a runtime asks at that version
            // only: the node's conflist offers 1.0.0 alone when a chained
            // reference plugin (Debian's) stops there.
            let mut conf: serde_json::Value =
                serde_json::from_slice(&stdin).expect("the plugin's stdin is JSON");
            conf["cniVersion"] = serde_json::json!("1.1.0");
            stdin = conf.to_string().into_bytes();
        }
        call.run(&self.bin_dir().join("flatnet"), &stdin)
    }

    pub fn pod(&self) -> SimPod<'_> {
        let netns = Netns::new();
        self.pod_in(netns, "")
    }

    /// A pod in `netns` (made by the caller, who may already run things in
    /// it), added with `cni_args` as CNI_ARGS (kubelet's
    /// `K8S_POD_NAMESPACE=..;K8S_POD_NAME=..`).
    pub fn pod_in(&self, netns: Netns, cni_args: &str) -> SimPod<'_> {
        let (container, out) = self.add(&netns, cni_args, None);
        assert!(out.success(), "ADD on {} failed: {out:?}", self.spec.name);
        self.attached(netns, container, &out)
    }

    /// A pod with hostPorts: `port_mappings` as a runtime passes them
    /// (`runtimeConfig.portMappings`, for a conflist whose flatnet entry
    /// declares the capability).
    pub fn pod_with_host_ports(&self, port_mappings: Value) -> SimPod<'_> {
        let netns = Netns::new();
        let (container, out) = self.add(&netns, "", Some(port_mappings));
        assert!(out.success(), "ADD on {} failed: {out:?}", self.spec.name);
        self.attached(netns, container, &out)
    }

    /// ADD of a new container in `netns`; its ID and the plugin's output.
    pub fn add(
        &self,
        netns: &Netns,
        cni_args: &str,
        port_mappings: Option<Value>,
    ) -> (String, CniOutput) {
        let container = unique("cpod-");
        let mut call = CniCall::new("ADD", &container, &netns.path(), "eth0");
        call.path = self.bin_dir().display().to_string();
        call.node = Some(self.netns.path());
        call.args = cni_args.to_string();
        let mut stdin = self.plugin_stdin();
        if let Some(mappings) = port_mappings {
            let mut conf: Value = serde_json::from_slice(&stdin).expect("plugin stdin");
            conf["runtimeConfig"] = serde_json::json!({"portMappings": mappings});
            stdin = conf.to_string().into_bytes();
        }
        let out = call.run(&self.bin_dir().join("flatnet"), &stdin);
        (container, out)
    }

    fn attached(&self, netns: Netns, container: String, out: &CniOutput) -> SimPod<'_> {
        let result = out.json();
        let addresses = result_ips(&result);
        let ip = addresses
            .iter()
            .find_map(|a| match a {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .expect("IPv4 address");
        let ip6 = addresses.iter().find_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        SimPod {
            node: self,
            netns,
            container,
            ip,
            ip6,
            result,
        }
    }
}

/// A pod on a simulated node; DEL on drop.
pub struct SimPod<'a> {
    pub node: &'a SimNode,
    pub netns: Netns,
    pub container: String,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address on a dual-stack node.
    pub ip6: Option<Ipv6Addr>,
    /// What ADD answered: a chained plugin's prevResult.
    pub result: Value,
}

impl Drop for SimPod<'_> {
    fn drop(&mut self) {
        let out = self
            .node
            .cni("DEL", Some((&self.container, &self.netns.path())));
        if !out.success() {
            eprintln!("cleanup DEL of {} failed: {out:?}", self.container);
        }
    }
}

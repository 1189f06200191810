//! TCP round trips through a ClusterIP: kube-proxy's iptables-mode rules
//! (the `kube-proxy-fixture` crate the integration tests use) in a network
//! namespace of the bench's own standing for a node, with a pair of pods on
//! the reference bridge and a pair on flatnet behind them, the same rules
//! for both. Every packet of such a flow goes through the node's netfilter
//! (the client's to DNAT, the backend's replies to undo it), on either
//! plugin: what is compared is what each adds around that.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use flatnet_harness::Netns;
use kube_proxy_fixture::{KubeProxy, Mode, Protocol, ServicePort};

use crate::cni::{Plugin, first_ip};

/// Where the backends listen, and the Service port.
const BACKEND_PORT: u16 = 8080;
const SERVICE_PORT: u16 = 80;
/// flatnet's pins for the node namespace (on the host's bpffs).
const PIN_ROOT: &str = "/sys/fs/bpf/flatnet-bench-node";

/// One plugin's pods behind one ClusterIP.
struct ServicePair {
    label: &'static str,
    plugin: Plugin,
    a: Netns,
    b: Netns,
    backend: SocketAddr,
    cluster_ip: SocketAddr,
}

/// The node namespace, its kube-proxy rules and the pods of each plugin.
pub struct ServicePaths {
    pairs: Vec<ServicePair>,
    node: Netns,
}

/// The pin directory of the ClusterIP path's flatnet `network`.
pub fn pin_dir(network: &str) -> std::path::PathBuf {
    std::path::Path::new(PIN_ROOT).join(network)
}

impl ServicePaths {
    /// `plugins`: (label, plugin, ClusterIP) for each; the plugins are run
    /// inside the node namespace, flatnet with its pins under `PIN_ROOT`.
    pub fn new(plugins: Vec<(&'static str, Plugin, IpAddr)>) -> anyhow::Result<Self> {
        let node = Netns::named("fb-node")?;
        crate::util::output(&mut node.command(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]))?;
        let mut paths = ServicePaths {
            pairs: Vec::new(),
            node,
        };
        for (label, mut plugin, cluster_ip) in plugins {
            // The pods reach ClusterIPs through their default route.
            let mut conf: serde_json::Value = serde_json::from_str(&plugin.conf)?;
            conf["ipam"]["routes"] = serde_json::json!([{"dst": "0.0.0.0/0"}]);
            plugin.conf = conf.to_string();
            plugin.runtime.node = Some(paths.node.path());
            plugin
                .runtime
                .env
                .push(("FLATNET_PIN_ROOT".into(), PIN_ROOT.into()));
            let a = Netns::named(&format!("fb-svc-{label}-a"))?;
            let b = Netns::named(&format!("fb-svc-{label}-b"))?;
            plugin.call("ADD", &format!("fb-svc-{label}-a"), &a.path())?;
            let result = plugin.call("ADD", &format!("fb-svc-{label}-b"), &b.path())?;
            let ip: IpAddr = first_ip(&result)?.parse().context("pod b's address")?;
            paths.pairs.push(ServicePair {
                label,
                plugin,
                a,
                b,
                backend: SocketAddr::new(ip, BACKEND_PORT),
                cluster_ip: SocketAddr::new(cluster_ip, SERVICE_PORT),
            });
        }
        let services: Vec<ServicePort> = paths
            .pairs
            .iter()
            .map(|pair| {
                ServicePort::cluster_ip(
                    &format!("bench-{}", pair.label),
                    pair.cluster_ip.ip(),
                    SERVICE_PORT,
                    Protocol::Tcp,
                    vec![pair.backend],
                )
            })
            .collect();
        let proxy = KubeProxy {
            mode: Mode::Iptables,
            // Both plugins' subnets (10.216.0.0 - 10.223.255.255).
            cluster_cidr_v4: "10.216.0.0/13".into(),
            cluster_cidr_v6: "fd44::/48".into(),
            service_cidr_v4: "10.96.0.0/16".into(),
            service_cidr_v6: "fd96::/108".into(),
            node_addresses: Vec::new(),
        };
        proxy
            .apply(&paths.node.name, &services)
            .map_err(|e| anyhow::anyhow!("kube-proxy rules in the bench's node namespace: {e}"))?;
        Ok(paths)
    }

    /// (p50, p99) µs of 64-byte round trips through `label`'s ClusterIP.
    pub fn round_trip(
        &self,
        label: &str,
        cpu: usize,
        duration: Duration,
    ) -> anyhow::Result<(f64, f64)> {
        let pair = self
            .pairs
            .iter()
            .find(|p| p.label == label)
            .with_context(|| format!("no ClusterIP pair {label}"))?;
        super::pingpong::round_trips(
            pair.a.path(),
            pair.b.path(),
            pair.backend,
            Some(pair.cluster_ip),
            cpu,
            duration,
        )
    }

    pub fn labels(&self) -> Vec<&'static str> {
        self.pairs.iter().map(|p| p.label).collect()
    }
}

impl Drop for ServicePaths {
    fn drop(&mut self) {
        for pair in &self.pairs {
            for (netns, id) in [(&pair.a, "a"), (&pair.b, "b")] {
                if let Err(e) =
                    pair.plugin
                        .call("DEL", &format!("fb-svc-{}-{id}", pair.label), &netns.path())
                {
                    eprintln!("bench cleanup: {e}");
                }
            }
        }
        // The last DEL unpinned flatnet's network; its root goes too. The
        // node namespace (rules, bridge, gateway device) goes on drop.
        let _ = std::fs::remove_dir_all(PathBuf::from(PIN_ROOT));
    }
}

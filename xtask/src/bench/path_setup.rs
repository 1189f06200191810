//! The paths the bench's rounds measure, set up once: the data-plane
//! pairs, the ClusterIP paths and the control-plane plugins, each with its
//! own network configuration.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::before::{self, Before};
use super::paths::Pair;
use super::policy;
use super::services::ServicePaths;
use crate::cni::Plugin;
use crate::install::REFERENCE_PLUGINS;

/// flatnet's `bigTcp` default: the GSO/GRO size of the tuned veth pair.
const BIG_TCP: u32 = 524_280;

/// The plugins the paths are set up with: the reference bridge, this
/// build's flatnet, and `--before`'s (with its own flatnet-ipam), their
/// IPAM state under `data_dir`.
pub(super) struct Plugins<'a> {
    /// The directory of this build's plugins.
    pub bin: &'a Path,
    pub cni_path: String,
    pub before: Option<&'a Before>,
    pub data_dir: &'a Path,
    pub flatnet_ipam: &'a str,
}

impl Plugins<'_> {
    fn bridge(&self, conf: String) -> Plugin {
        Plugin::new(
            PathBuf::from(REFERENCE_PLUGINS).join("bridge"),
            &self.cni_path,
            conf,
        )
    }

    fn flatnet(&self, conf: String) -> Plugin {
        Plugin::new(self.bin.join("flatnet"), &self.cni_path, conf)
    }

    /// The earlier build's plugin, with its own flatnet-ipam.
    fn before(&self, conf: String) -> Option<Plugin> {
        self.before.map(|b| {
            let cni_path = format!("{}:{REFERENCE_PLUGINS}", b.bin.display());
            Plugin::new(b.bin.join("flatnet"), &cni_path, conf)
        })
    }

    /// A flatnet configuration with flatnet-ipam.
    fn flatnet_conf(&self, network: &str, device: &str, prefix: &str) -> String {
        conf(
            "flatnet",
            network,
            device,
            prefix,
            self.flatnet_ipam,
            self.data_dir,
        )
    }
}

/// The plugins the control-plane timings (IPAM alone, CNI ADD and DEL)
/// call.
pub(super) struct ControlPlanePlugins {
    pub bridge: Plugin,
    pub flatnet: Plugin,
}

/// The data-plane pairs: bridge, flatnet (tc, XDP, with NetworkPolicy),
/// the bare veth pairs, and `--before`'s flatnet.
pub(super) fn set_up_pairs(
    plugins: &Plugins,
    policy_fixture: &PathBuf,
) -> anyhow::Result<Vec<Pair>> {
    let data_dir = plugins.data_dir;
    let flatnet_ipam = plugins.flatnet_ipam;
    let mut pairs = vec![
        Pair::attached(
            "bridge",
            plugins.bridge(conf(
                "bridge",
                "fb-bridge",
                "fbbr0",
                "10.211.0",
                "host-local",
                data_dir,
            )),
        )?,
        Pair::attached(
            "flatnet",
            plugins.flatnet(conf(
                "flatnet",
                "fb-flatnet",
                "fbfl0",
                "10.212.0",
                flatnet_ipam,
                data_dir,
            )),
        )?,
        Pair::attached(
            "flatnet-xdp",
            plugins.flatnet(
                conf(
                    "flatnet",
                    "fb-flatnet-xdp",
                    "fbflx0",
                    "10.216.0",
                    flatnet_ipam,
                    data_dir,
                )
                .replace(
                    "\"type\":\"flatnet\"",
                    "\"type\":\"flatnet\",\"datapath\":\"xdp\"",
                ),
            ),
        )?,
        {
            let pair = Pair::attached(
                policy::LABEL,
                plugins.flatnet(conf(
                    "flatnet",
                    policy::NETWORK,
                    "fbflp0",
                    "10.218.0",
                    flatnet_ipam,
                    data_dir,
                )),
            )?;
            let summary = policy::apply(policy_fixture, policy::NETWORK, &pair.ip_a, &pair.ip_b)?;
            println!("NetworkPolicy pair: {summary}");
            pair
        },
        Pair::bare_veth("veth", "10.213.0", None)?,
        Pair::bare_veth("veth-big", "10.217.0", Some(BIG_TCP))?,
    ];
    if let Some(plugin) =
        plugins.before(plugins.flatnet_conf(before::NETWORK, "fbflb0", "10.221.0"))
    {
        pairs.push(Pair::attached(before::LABEL, plugin)?);
    }
    Ok(pairs)
}

/// The ClusterIP paths: bridge (kube-proxy's rules), flatnet, and
/// `--before`'s flatnet.
pub(super) fn set_up_service_paths(plugins: &Plugins) -> anyhow::Result<ServicePaths> {
    let mut service_plugins = vec![
        (
            "bridge",
            plugins.bridge(conf(
                "bridge",
                "fb-svc-bridge",
                "fbsvbr0",
                "10.219.0",
                "host-local",
                plugins.data_dir,
            )),
            "10.96.0.10".parse()?,
        ),
        (
            "flatnet",
            plugins.flatnet(conf(
                "flatnet",
                before::SERVICE_NETWORK,
                "fbsvfl0",
                "10.220.0",
                plugins.flatnet_ipam,
                plugins.data_dir,
            )),
            "10.96.0.11".parse()?,
        ),
    ];
    if let Some(plugin) =
        plugins.before(plugins.flatnet_conf(before::SERVICE_NETWORK_BEFORE, "fbsvfb0", "10.223.0"))
    {
        service_plugins.push((before::LABEL, plugin, "10.96.0.12".parse()?));
    }
    ServicePaths::new(service_plugins)
}

pub(super) fn control_plane_plugins(plugins: &Plugins) -> ControlPlanePlugins {
    ControlPlanePlugins {
        bridge: plugins.bridge(conf(
            "bridge",
            "fb-cp-bridge",
            "fbcpbr0",
            "10.214.0",
            "host-local",
            plugins.data_dir,
        )),
        flatnet: plugins.flatnet(conf(
            "flatnet",
            "fb-cp-flatnet",
            "fbcpfl0",
            "10.215.0",
            plugins.flatnet_ipam,
            plugins.data_dir,
        )),
    }
}

/// Network, gateway device and subnet for one plugin configuration.
fn conf(
    kind: &str,
    name: &str,
    device: &str,
    prefix: &str,
    ipam: &str,
    data_dir: &std::path::Path,
) -> String {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": name,
        "type": kind,
        "bridge": device,
        "ipam": {"type": ipam, "subnet": format!("{prefix}.0/24"), "dataDir": data_dir.join(name)},
    });
    if kind == "bridge" {
        // The reference plugin's usual configuration.
        conf["isGateway"] = json!(true);
    }
    conf.to_string()
}

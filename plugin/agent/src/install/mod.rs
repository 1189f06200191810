//! What the agent puts on the node for the container runtime: the plugin
//! binaries in the CNI bin dir and the conflist in the CNI conf dir, each
//! written to a temporary file in the same directory, flushed, and renamed
//! over the old one, so a runtime only ever sees a complete file.

#[cfg(test)]
mod manifests;
pub mod uninstall;
pub mod versions;

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

use crate::error::{AgentError, Result};
use flatnet::config::BIG_TCP_SIZES;
use flatnet_datapath::DatapathMode;
use flatnet_datapath::bpf::sizes::{DEFAULT_MEMORY_RATIO, MapSizing};
use flatnet_datapath::netlink::GsoLimits;
use flatnet_datapath::node::markers::AGENT_MANAGED_KEY;

/// The binaries a node needs, installed side by side.
pub const BINARIES: [&str; 2] = ["flatnet", "flatnet-ipam"];

/// What goes into the conflist besides the pod CIDRs.
#[derive(Debug, Clone)]
pub struct ConflistSpec {
    pub network: String,
    pub bridge: String,
    pub datapath: DatapathMode,
    pub mtu: Option<u32>,
    pub ip_masq: bool,
    pub ipam_data_dir: Option<PathBuf>,
    /// The agent's pin root: the plugin must pin its pods' entries into the
    /// maps the agent's uplink program reads, so it learns the root here
    /// (a runtime sets no environment of flatnet's).
    pub pin_root: PathBuf,
    /// Chain the reference portmap plugin (hostPort).
    pub portmap: bool,
    /// flatnet serves hostPorts itself (declares `portMappings`).
    pub host_ports_in_bpf: bool,
    /// Chain the reference bandwidth plugin (the bandwidth annotations).
    pub bandwidth: bool,
    /// The GSO size pods may send (`pods_gso_size`): `bigTcp` false at 64
    /// KiB or less, that size above; None leaves the plugin's default.
    pub big_tcp: Option<u32>,
    /// The CNI versions offered in `cniVersions` (`versions.rs`): 1.1.0
    /// only when every chained plugin speaks it.
    pub cni_versions: Vec<&'static str>,
    /// How the maps sized per node are made, for the plugin to load them
    /// the same way (`mapSizes`, `mapMemoryRatio`).
    pub map_sizing: MapSizing,
}

/// The largest GSO packet pods may build, given the limits of the devices
/// their packets leave the node by (the uplink, the VXLAN device): the
/// smallest of them. A pod sending bigger ones (BIG TCP's 512 KiB) through
/// a device that takes 64 KiB has every packet cut into MTU-sized ones in
/// software on the way out, and the peer node handles each alone: cross-
/// node TCP ran at 2.6 Gbit/s so, against 6 through flannel's stack.
/// None when no device says.
pub fn pods_gso_size(devices: &[GsoLimits]) -> Option<u32> {
    devices
        .iter()
        .flat_map(|limits| [limits.gso_max_size, limits.gso_ipv4_max_size])
        .flatten()
        .min()
}

/// The reference plugins a conflist chains after flatnet, in order.
pub fn chained(portmap: bool, bandwidth: bool) -> Vec<&'static str> {
    [("portmap", portmap), ("bandwidth", bandwidth)]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect()
}

/// The reference plugins the agent puts on the node: the ones the conflist
/// chains, and `loopback`, which containerd's and CRI-O's CRI run for every
/// pod sandbox's `lo` (a node without the CNI reference plugins has none,
/// and then no pod starts: "failed to find plugin loopback").
pub fn node_plugins(portmap: bool, bandwidth: bool) -> Vec<&'static str> {
    let mut plugins = chained(portmap, bandwidth);
    plugins.push("loopback");
    plugins
}

/// The conflist for a node owning `pod_cidrs`: flatnet with flatnet-ipam
/// handing out each CIDR, the first address of each as the gateway.
/// `cniVersion` 1.0.0 for runtimes whose libcni stops there; `cniVersions`
/// lets newer ones use 1.1.0 (STATUS, GC) when the chain speaks it.
pub fn render_conflist(spec: &ConflistSpec, pod_cidrs: &[IpNetwork]) -> Result<Value> {
    if pod_cidrs.is_empty() {
        return Err(AgentError::Config(
            "no pod CIDR for this node: the conflist needs one".into(),
        ));
    }
    let mut ranges = Vec::new();
    for cidr in pod_cidrs {
        ranges.push(json!([{"subnet": cidr.to_string(), "gateway": gateway(cidr)?.to_string()}]));
    }
    let mut ipam = json!({"type": "flatnet-ipam", "ranges": ranges});
    if let Some(dir) = &spec.ipam_data_dir {
        ipam["dataDir"] = json!(dir.display().to_string());
    }
    let mut plugin = json!({
        "type": "flatnet",
        // What a runtime may pass as runtimeConfig (as the install conflist);
        // `bandwidth`: to keep shaped pods' traffic on the shaping qdiscs.
        "capabilities": {"mtu": true, "mac": true, "ips": true, "bandwidth": true},
        "bridge": spec.bridge,
        "datapath": spec.datapath.as_str(),
        AGENT_MANAGED_KEY: true,
        "pinRoot": spec.pin_root.display().to_string(),
        "ipam": ipam,
    });
    if spec.host_ports_in_bpf {
        plugin["capabilities"]["portMappings"] = json!(true);
    }
    if !spec.map_sizing.overrides.is_empty() {
        plugin["mapSizes"] = json!(spec.map_sizing.overrides);
    }
    if spec.map_sizing.memory_ratio != DEFAULT_MEMORY_RATIO {
        plugin["mapMemoryRatio"] = json!(spec.map_sizing.memory_ratio);
    }
    if let Some(mtu) = spec.mtu {
        plugin["mtu"] = json!(mtu);
    }
    if spec.ip_masq {
        plugin["ipMasq"] = json!(true);
    }
    if let Some(size) = spec.big_tcp {
        plugin["bigTcp"] = if BIG_TCP_SIZES.contains(&size) {
            json!(size)
        } else if size > *BIG_TCP_SIZES.end() {
            json!(true)
        } else {
            json!(false)
        };
    }
    let mut plugins = vec![plugin];
    // After flatnet, as flannel's and Calico's conflists have them: portmap
    // needs the pod's address from flatnet's result; bandwidth shapes the
    // host veth flatnet made (its egress qdiscs sit next to flatnet's tcx
    // links). Both are run by the runtime in reverse order on DEL.
    if spec.portmap {
        plugins.push(json!({
            "type": "portmap",
            "capabilities": {"portMappings": true},
            "snat": true,
        }));
    }
    if spec.bandwidth {
        plugins.push(json!({
            "type": "bandwidth",
            "capabilities": {"bandwidth": true},
        }));
    }
    Ok(json!({
        "cniVersion": "1.0.0",
        "cniVersions": spec.cni_versions,
        "name": spec.network,
        "plugins": plugins,
    }))
}

/// The first address of a CIDR: the pods' gateway, held by the node.
pub fn gateway(cidr: &IpNetwork) -> Result<IpAddr> {
    let too_small = || AgentError::Config(format!("pod CIDR {cidr} is too small for pods"));
    let limit = if cidr.is_ipv4() { 30 } else { 126 };
    if cidr.prefix() > limit {
        return Err(too_small());
    }
    Ok(match cidr.network() {
        IpAddr::V4(net) => IpAddr::from(std::net::Ipv4Addr::from(u32::from(net) + 1)),
        IpAddr::V6(net) => IpAddr::from(std::net::Ipv6Addr::from(u128::from(net) + 1)),
    })
}

/// Writes `bytes` to `path` atomically with `mode`; false (and nothing
/// written) when the file already holds exactly that.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    replace_atomically(path, mode, |file| file.write_all(bytes))?;
    Ok(true)
}

/// Copies `source` to `target` atomically with `mode`; false (and nothing
/// written) when `target` already holds the same bytes. Both are streamed,
/// never held in memory: a debug build's plugins are ~90 MB each, more than
/// the DaemonSet's memory limit.
pub fn copy_atomically(source: &Path, target: &Path, mode: u32) -> Result<bool> {
    let reading = |e| AgentError::io(format!("reading {}", source.display()), e);
    if same_contents(source, target).map_err(reading)? {
        return Ok(false);
    }
    let mut from = std::fs::File::open(source).map_err(reading)?;
    replace_atomically(target, mode, |file| {
        std::io::copy(&mut from, file).map(|_| ())
    })?;
    Ok(true)
}

/// Whether `target` exists and holds exactly `source`'s bytes.
fn same_contents(source: &Path, target: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut ours = std::io::BufReader::new(std::fs::File::open(source)?);
    let Ok(theirs) = std::fs::File::open(target) else {
        return Ok(false);
    };
    if theirs.metadata()?.len() != ours.get_ref().metadata()?.len() {
        return Ok(false);
    }
    let mut theirs = std::io::BufReader::new(theirs);
    let (mut a, mut b) = ([0u8; 64 * 1024], [0u8; 64 * 1024]);
    loop {
        let n = ours.read(&mut a)?;
        if n == 0 {
            return Ok(true);
        }
        theirs.read_exact(&mut b[..n])?;
        if a[..n] != b[..n] {
            return Ok(false);
        }
    }
}

/// Fills a hidden temporary file beside `path` and renames it over `path`,
/// so a reader sees the old file or the new one, never a part.
fn replace_atomically(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| AgentError::Config(format!("{} has no directory", path.display())))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| AgentError::io(format!("creating {}", dir.display()), e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A leading dot and a ".tmp" suffix: runtimes load only *.conf,
    // *.conflist and *.json, and skip hidden files.
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let outcome = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temp)?;
        fill(&mut file)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        // The rename itself must survive a crash too.
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = outcome {
        let _ = std::fs::remove_file(&temp);
        return Err(AgentError::io(format!("writing {}", path.display()), e));
    }
    Ok(())
}

/// Copies each of `names` from `from` into `to` (atomically, executable);
/// returns the ones that changed. Replacing by rename never disturbs a
/// plugin process running the old file.
pub fn install_binaries(from: &Path, to: &Path, names: &[&str]) -> Result<Vec<String>> {
    let mut installed = Vec::new();
    for name in names {
        if copy_atomically(&from.join(name), &to.join(name), 0o755)? {
            installed.push((*name).to_string());
        }
    }
    Ok(installed)
}

/// Puts each chained reference plugin into `to` from `from`: copied when
/// `to` has none; a plugin already there is replaced only when both name
/// their release and ours is newer (a node's own newer or unversioned
/// build stays). Returns the ones installed; a plugin found in neither
/// place is an error, since every ADD of the conflist would fail on it.
pub fn install_reference_plugins(from: &Path, to: &Path, names: &[&str]) -> Result<Vec<String>> {
    let mut installed = Vec::new();
    for name in names {
        let (source, target) = (from.join(name), to.join(name));
        let present = target.is_file();
        if !source.is_file() {
            if present {
                continue;
            }
            let remedy = if *name == "loopback" {
                "the runtime runs it for every pod's lo".to_string()
            } else {
                format!("or turn the chaining off (--chain-{name}=false)")
            };
            return Err(AgentError::Config(format!(
                "the node needs the reference {name} plugin, but neither {} nor {} has it: install the CNI reference plugins there; {remedy}",
                target.display(),
                source.display()
            )));
        }
        if present {
            match (release_of(&target), release_of(&source)) {
                (Some(theirs), Some(ours)) if ours > theirs => {}
                _ => continue,
            }
        }
        if copy_atomically(&source, &target, 0o755)? {
            installed.push((*name).to_string());
        }
    }
    Ok(installed)
}

/// The release a reference plugin names when run without CNI_COMMAND
/// ("CNI portmap plugin v1.1.1"); None for "version unknown" builds.
fn release_of(plugin: &Path) -> Option<semver::Version> {
    let output = std::process::Command::new(plugin)
        .env_remove("CNI_COMMAND")
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    parse_release(&String::from_utf8_lossy(&output.stdout))
        .or_else(|| parse_release(&String::from_utf8_lossy(&output.stderr)))
}

fn parse_release(about: &str) -> Option<semver::Version> {
    about
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('v'))
        .find_map(|text| semver::Version::parse(text).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flatnet::config::NetConf;

    fn spec() -> ConflistSpec {
        ConflistSpec {
            network: "flatnet".into(),
            bridge: "flatnet0".into(),
            datapath: DatapathMode::Tc,
            mtu: Some(1450),
            ip_masq: false,
            ipam_data_dir: None,
            pin_root: PathBuf::from("/sys/fs/bpf/flatnet"),
            portmap: true,
            host_ports_in_bpf: false,
            bandwidth: true,
            big_tcp: None,
            cni_versions: vec!["1.0.0", "1.1.0"],
            map_sizing: Default::default(),
        }
    }

    #[test]
    fn map_sizes_travel_in_the_conflist_only_when_set() {
        let cidrs = ["10.244.1.0/24".parse().unwrap()];
        let plain = render_conflist(&spec(), &cidrs).unwrap();
        assert!(plain["plugins"][0].get("mapSizes").is_none());
        assert!(plain["plugins"][0].get("mapMemoryRatio").is_none());
        let mut sized = spec();
        sized.map_sizing.overrides.insert("POLICY_PEERS".into(), 64);
        sized.map_sizing.memory_ratio = 0.0;
        let list = render_conflist(&sized, &cidrs).unwrap();
        assert_eq!(list["plugins"][0]["mapSizes"], json!({"POLICY_PEERS": 64}));
        assert_eq!(list["plugins"][0]["mapMemoryRatio"], json!(0.0));
        // What the plugin reads back (a runtime adds the list's name and
        // version to each entry).
        let mut entry = list["plugins"][0].clone();
        entry["cniVersion"] = json!("1.0.0");
        entry["name"] = json!("flatnet");
        let conf = NetConf::parse(entry.to_string().as_bytes()).unwrap();
        assert_eq!(conf.map_sizing, sized.map_sizing);
    }

    #[test]
    fn the_conflist_hands_out_the_nodes_cidrs_through_flatnet_ipam() {
        let cidrs = [
            "10.244.3.0/24".parse().unwrap(),
            "fd10:3::/64".parse().unwrap(),
        ];
        let list = render_conflist(&spec(), &cidrs).unwrap();
        assert_eq!(list["name"], "flatnet");
        let plugin = &list["plugins"][0];
        assert_eq!(plugin["type"], "flatnet");
        assert_eq!(plugin["agentManaged"], true);
        assert_eq!(plugin["mtu"], 1450);
        assert_eq!(
            plugin["capabilities"],
            json!({"mtu": true, "mac": true, "ips": true, "bandwidth": true})
        );
        assert_eq!(plugin["ipam"]["type"], "flatnet-ipam");
        assert_eq!(
            plugin["ipam"]["ranges"],
            json!([
                [{"subnet": "10.244.3.0/24", "gateway": "10.244.3.1"}],
                [{"subnet": "fd10:3::/64", "gateway": "fd10:3::1"}]
            ])
        );
        // The plugin reads its entry as a runtime passes it.
        let mut entry = plugin.clone();
        entry["name"] = list["name"].clone();
        entry["cniVersion"] = json!("1.1.0");
        let conf = NetConf::parse(entry.to_string().as_bytes()).unwrap();
        assert_eq!(conf.mtu, Some(1450));
        assert_eq!(conf.ipam_type.as_deref(), Some("flatnet-ipam"));
    }

    #[test]
    fn pods_send_no_bigger_gso_packets_than_the_way_out_takes() {
        let limits = |gso, gso_ipv4| GsoLimits {
            gso_max_size: gso,
            gso_ipv4_max_size: gso_ipv4,
            ..GsoLimits::default()
        };
        assert_eq!(pods_gso_size(&[]), None);
        assert_eq!(pods_gso_size(&[limits(None, None)]), None);
        assert_eq!(
            pods_gso_size(&[limits(Some(65_536), Some(65_536))]),
            Some(65_536)
        );
        // The smallest of every device's limits.
        assert_eq!(
            pods_gso_size(&[
                limits(Some(185_000), Some(185_000)),
                limits(Some(524_280), Some(100_000))
            ]),
            Some(100_000)
        );
        let cidrs = ["10.244.3.0/24".parse().unwrap()];
        for (size, written) in [
            (None, Value::Null),
            (Some(65_536), json!(false)),
            (Some(100_000), json!(100_000)),
            (Some(1 << 20), json!(true)),
        ] {
            let list = render_conflist(
                &ConflistSpec {
                    big_tcp: size,
                    ..spec()
                },
                &cidrs,
            )
            .unwrap();
            assert_eq!(list["plugins"][0]["bigTcp"], written, "{size:?}");
        }
    }

    #[test]
    fn portmap_and_bandwidth_follow_flatnet_with_their_capabilities() {
        let cidrs = ["10.244.3.0/24".parse().unwrap()];
        let list = render_conflist(&spec(), &cidrs).unwrap();
        let types: Vec<&str> = list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["flatnet", "portmap", "bandwidth"]);
        assert_eq!(
            list["plugins"][1]["capabilities"],
            json!({"portMappings": true})
        );
        assert_eq!(list["plugins"][1]["snat"], true);
        assert_eq!(
            list["plugins"][2]["capabilities"],
            json!({"bandwidth": true})
        );
        let alone = ConflistSpec {
            portmap: false,
            bandwidth: false,
            ..spec()
        };
        let list = render_conflist(&alone, &cidrs).unwrap();
        assert_eq!(list["plugins"].as_array().unwrap().len(), 1);
        // hostPorts in BPF: flatnet takes portmap's capability.
        let bpf = ConflistSpec {
            portmap: false,
            host_ports_in_bpf: true,
            ..spec()
        };
        let list = render_conflist(&bpf, &cidrs).unwrap();
        assert_eq!(list["plugins"].as_array().unwrap().len(), 2);
        assert_eq!(list["plugins"][0]["capabilities"]["portMappings"], true);
        assert_eq!(list["plugins"][1]["type"], "bandwidth");
        assert!(chained(false, false).is_empty());
        assert_eq!(chained(true, true), ["portmap", "bandwidth"]);
        assert_eq!(node_plugins(false, false), ["loopback"]);
        assert_eq!(
            node_plugins(true, true),
            ["portmap", "bandwidth", "loopback"]
        );
    }

    #[test]
    fn releases_are_read_from_the_about_line() {
        assert_eq!(
            parse_release("CNI portmap plugin v1.1.1\nCNI protocol versions supported: 1.0.0"),
            Some(semver::Version::new(1, 1, 1))
        );
        assert_eq!(parse_release("CNI portmap plugin version unknown"), None);
    }

    #[test]
    fn reference_plugins_are_installed_when_missing_and_a_present_one_is_kept() {
        let dir = std::env::temp_dir().join(format!("flatnet-refplugins-{}", std::process::id()));
        let (from, to) = (dir.join("from"), dir.join("to"));
        std::fs::create_dir_all(&from).unwrap();
        // Scripts that name their release, as the reference plugins do.
        let script = |path: &Path, release: &str| {
            std::fs::write(
                path,
                format!("#!/bin/sh\necho CNI portmap plugin {release}\n"),
            )
            .unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        script(&from.join("portmap"), "v1.2.0");
        assert_eq!(
            install_reference_plugins(&from, &to, &["portmap"]).unwrap(),
            ["portmap"]
        );
        // Same release: kept.
        assert!(
            install_reference_plugins(&from, &to, &["portmap"])
                .unwrap()
                .is_empty()
        );
        // The node's newer one and an unversioned one: kept.
        script(&to.join("portmap"), "v1.5.0");
        assert!(
            install_reference_plugins(&from, &to, &["portmap"])
                .unwrap()
                .is_empty()
        );
        script(&to.join("portmap"), "version unknown");
        assert!(
            install_reference_plugins(&from, &to, &["portmap"])
                .unwrap()
                .is_empty()
        );
        // An older one: replaced.
        script(&to.join("portmap"), "v1.0.0");
        assert_eq!(
            install_reference_plugins(&from, &to, &["portmap"]).unwrap(),
            ["portmap"]
        );
        // Nowhere at all: refused with what to do.
        let err = install_reference_plugins(&from, &to, &["bandwidth"]).unwrap_err();
        assert!(err.to_string().contains("--chain-bandwidth=false"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_cidr_or_a_tiny_one_is_refused() {
        assert!(render_conflist(&spec(), &[]).is_err());
        assert!(render_conflist(&spec(), &["10.0.0.0/31".parse().unwrap()]).is_err());
    }

    #[test]
    fn atomic_writes_replace_whole_files_and_skip_identical_ones() {
        let dir = std::env::temp_dir().join(format!("flatnet-install-{}", std::process::id()));
        let path = dir.join("10-flatnet.conflist");
        assert!(write_atomically(&path, b"one", 0o644).unwrap());
        assert!(!write_atomically(&path, b"one", 0o644).unwrap());
        assert!(write_atomically(&path, b"two", 0o644).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "a temporary file was left: {names:?}");
        let bin = dir.join("bin");
        std::fs::write(dir.join("flatnet"), b"\x7fELF").unwrap();
        assert_eq!(
            install_binaries(&dir, &bin, &["flatnet"]).unwrap(),
            ["flatnet"]
        );
        assert!(
            install_binaries(&dir, &bin, &["flatnet"])
                .unwrap()
                .is_empty()
        );
        let mode = std::fs::metadata(bin.join("flatnet"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn copies_compare_every_chunk_not_only_the_length() {
        let dir = std::env::temp_dir().join(format!("flatnet-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (source, target) = (dir.join("source"), dir.join("target"));
        // Larger than one comparison chunk, differing only in the last byte.
        let mut bytes = vec![7u8; 200 * 1024];
        std::fs::write(&source, &bytes).unwrap();
        assert!(copy_atomically(&source, &target, 0o755).unwrap());
        assert!(!copy_atomically(&source, &target, 0o755).unwrap());
        *bytes.last_mut().unwrap() = 8;
        std::fs::write(&source, &bytes).unwrap();
        assert!(copy_atomically(&source, &target, 0o755).unwrap());
        assert_eq!(std::fs::read(&target).unwrap(), bytes);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

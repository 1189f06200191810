//! flatnet's network configuration (stdin), parsed and validated before
//! anything is touched. Pure parsing: it names only flatnet-cni, the two
//! plain datapath types and the map sizing (the fuzz build compiles it on
//! its own).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::map_sizing::{DEFAULT_MEMORY_RATIO, MapSizing};
pub use crate::{DatapathMode, Shaping};
use flatnet_cni::config::{MTU_RANGE, check_stdin, validate_network_name};
use flatnet_cni::env::{is_spec_name, validate_ifname};
use flatnet_cni::error::{Error, Result};
use flatnet_cni::result::{CniResult, Dns};
use flatnet_cni::runtime::{Mac, RuntimeOptions};
use flatnet_cni::version::SpecVersion;
use serde::Deserialize;

/// `bigTcp`: absent or `true` is the largest size the kernel takes, `false`
/// turns BIG TCP off, a number is a size of its own.
fn big_tcp_size(value: Option<&serde_json::Value>) -> Result<Option<u32>> {
    let largest = *BIG_TCP_SIZES.end();
    match value {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(true)) => {
            Ok(Some(largest))
        }
        Some(serde_json::Value::Bool(false)) => Ok(None),
        Some(other) => other
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| BIG_TCP_SIZES.contains(n))
            .map(Some)
            .ok_or_else(|| {
                Error::config(format!(
                    "\"bigTcp\" {other} is not valid: use true (the kernel's largest, {largest}), false (64 KiB, no BIG TCP), or a size in bytes from {} to {largest}",
                    BIG_TCP_SIZES.start()
                ))
            }),
    }
}

pub const DEFAULT_GATEWAY_DEVICE: &str = "flatnet0";
/// GSO/GRO sizes `bigTcp` may set on pod interfaces: above the classic 64
/// KiB, up to the kernel's GSO_MAX_SIZE and GRO_MAX_SIZE (8 x 65535 bytes),
/// which is also a veth's `tso_max_size`.
pub const BIG_TCP_SIZES: std::ops::RangeInclusive<u32> = 65_537..=524_280;

/// The fields flatnet reads; unknown keys are ignored, as the spec expects.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawNetConf {
    #[serde(default)]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    pub bridge: Option<String>,
    pub mtu: Option<u32>,
    pub ipam: Option<serde_json::Value>,
    pub dns: Option<Dns>,
    pub prev_result: Option<serde_json::Value>,
    pub datapath: Option<DatapathMode>,
    pub log_file: Option<PathBuf>,
    pub ip_masq: Option<bool>,
    pub pin_root: Option<PathBuf>,
    /// `true` (the default), `false`, or a GSO/GRO size in bytes.
    pub big_tcp: Option<serde_json::Value>,
    /// Map name -> entries, for the maps sized per node.
    pub map_sizes: Option<BTreeMap<String, u32>>,
    pub map_memory_ratio: Option<f64>,
    /// Capability arguments from the runtime (`mtu`, `mac`, `ips`, ...).
    pub runtime_config: Option<serde_json::Value>,
    /// `args.cni.*` (conventions: `ips`, `mac`).
    pub args: Option<serde_json::Value>,
}

/// A validated network configuration.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub version: SpecVersion,
    pub name: String,
    pub gateway_device: String,
    pub mtu: Option<u32>,
    /// `ipam.type`: the plugin binary looked up in CNI_PATH.
    pub ipam_type: Option<String>,
    pub dns: Dns,
    pub prev_result: Option<CniResult>,
    pub datapath: DatapathMode,
    pub log_file: Option<PathBuf>,
    /// Masquerade traffic from the pods to outside their subnets.
    pub ip_masq: bool,
    /// The pod interface's MAC from `runtimeConfig.mac` or `args.cni.mac`
    /// (the runner falls back to CNI_ARGS `MAC=`); else derived from the name hash.
    pub mac: Option<Mac>,
    /// What the bandwidth plugin chained after flatnet shapes for this pod.
    pub shaping: Shaping,
    /// `pinRoot`: where the network's datapath is pinned, when not the
    /// default. flatnet-agent writes it into its conflist, so a plugin that a
    /// runtime runs pins where the agent does (see `flatnet_datapath::bpf::pin_root_for`).
    pub pin_root: Option<PathBuf>,
    /// `mapSizes` and `mapMemoryRatio`: how the maps sized per node are
    /// made (see `flatnet_datapath::bpf::sizes`).
    pub map_sizing: MapSizing,
    /// `bigTcp`: the GSO/GRO size set on both ends of each pod's veth pair
    /// (tc datapath), or None: the kernel's 64 KiB default.
    pub big_tcp: Option<u32>,
    /// `runtimeConfig.portMappings`: hostPorts served in BPF (flatnet's
    /// entry declares the capability instead of chaining portmap). Read
    /// where they are served (ADD, CHECK), not by DEL: a DEL goes through
    /// whatever a runtime passes.
    pub port_mappings: Option<serde_json::Value>,
}

impl NetConf {
    /// Parses and validates stdin. `needs_ipam` is false for verbs that can do without.
    pub fn parse(stdin: &[u8]) -> Result<Self> {
        check_stdin(stdin)?;
        let raw: RawNetConf =
            serde_json::from_slice(stdin).map_err(|e| Error::decode("network configuration", e))?;
        Self::validate(raw)
    }

    fn validate(raw: RawNetConf) -> Result<Self> {
        let version = SpecVersion::parse(&raw.cni_version)?;
        validate_network_name(&raw.name)?;
        let gateway_device = raw
            .bridge
            .unwrap_or_else(|| DEFAULT_GATEWAY_DEVICE.to_string());
        validate_ifname(&gateway_device)
            .map_err(|reason| Error::config(format!("\"bridge\": {reason}")))?;
        if let Some(mtu) = raw.mtu
            && !MTU_RANGE.contains(&mtu)
        {
            return Err(Error::config(format!(
                "\"mtu\" {mtu} is out of range: use {}..={}",
                MTU_RANGE.start(),
                MTU_RANGE.end()
            )));
        }
        let ipam_type = match &raw.ipam {
            None => None,
            Some(ipam) if !ipam.is_object() => {
                return Err(Error::config(
                    "\"ipam\" must be an object: {\"type\": \"flatnet-ipam\", ...}",
                ));
            }
            Some(ipam) => {
                let kind = ipam
                    .get("type")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default();
                if kind.is_empty() {
                    return Err(Error::config(
                        "\"ipam.type\" is missing: name the IPAM plugin, e.g. \"flatnet-ipam\"",
                    ));
                }
                if !is_spec_name(kind) {
                    return Err(Error::config(format!(
                        "\"ipam.type\" {kind:?} is not a plugin name (letters, digits, '_', '.', '-'; no paths)"
                    )));
                }
                Some(kind.to_string())
            }
        };
        let runtime = RuntimeOptions::from_config(raw.runtime_config.as_ref(), raw.args.as_ref())?;
        let prev_result = raw
            .prev_result
            .as_ref()
            .map(|value| CniResult::from_value(value, "prevResult"))
            .transpose()?;
        if let Some(root) = &raw.pin_root
            && !root.is_absolute()
        {
            return Err(Error::config(format!(
                "\"pinRoot\" {} is not an absolute path: name a directory on a bpf file system, e.g. /sys/fs/bpf/flatnet",
                root.display()
            )));
        }
        let big_tcp = big_tcp_size(raw.big_tcp.as_ref())?;
        let map_sizing = MapSizing {
            memory_ratio: raw.map_memory_ratio.unwrap_or(DEFAULT_MEMORY_RATIO),
            overrides: raw.map_sizes.clone().unwrap_or_default(),
        };
        map_sizing.validate().map_err(Error::config)?;
        Ok(NetConf {
            version,
            name: raw.name,
            gateway_device,
            // `runtimeConfig.mtu` is per attachment and beats the network's.
            mtu: runtime.mtu.or(raw.mtu),
            ipam_type,
            dns: raw.dns.unwrap_or_default(),
            prev_result,
            datapath: raw.datapath.unwrap_or_default(),
            log_file: raw.log_file,
            ip_masq: raw.ip_masq.unwrap_or(false),
            mac: runtime.mac,
            shaping: Shaping {
                ingress: runtime.bandwidth.ingress,
                egress: runtime.bandwidth.egress,
            },
            pin_root: raw.pin_root,
            map_sizing,
            big_tcp,
            port_mappings: raw
                .runtime_config
                .as_ref()
                .and_then(|config| config.get("portMappings"))
                .filter(|mappings| !mappings.is_null())
                .cloned(),
        })
    }

    /// The IPAM plugin name, or a config error for verbs that need one.
    pub fn require_ipam(&self) -> Result<&str> {
        self.ipam_type
            .as_deref()
            .ok_or_else(|| Error::config("\"ipam\" is missing: flatnet needs an IPAM plugin, e.g. {\"type\": \"flatnet-ipam\", ...}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<NetConf> {
        NetConf::parse(value.to_string().as_bytes())
    }

    fn base() -> serde_json::Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "pods",
            "type": "flatnet",
            "ipam": {"type": "host-local", "subnet": "10.42.0.0/16"}
        })
    }

    fn with(key: &str, value: serde_json::Value) -> serde_json::Value {
        let mut conf = base();
        conf[key] = value;
        conf
    }

    #[test]
    fn defaults_apply() {
        let conf = parse(base()).unwrap();
        assert_eq!(conf.gateway_device, "flatnet0");
        assert_eq!(conf.datapath, DatapathMode::Tc);
        assert_eq!(conf.ipam_type.as_deref(), Some("host-local"));
        assert!(conf.mtu.is_none());
    }

    #[test]
    fn big_tcp_is_on_by_default_off_on_request_or_a_size() {
        assert_eq!(parse(base()).unwrap().big_tcp, Some(524_280));
        assert_eq!(
            parse(with("bigTcp", json!(true))).unwrap().big_tcp,
            Some(524_280)
        );
        assert_eq!(parse(with("bigTcp", json!(false))).unwrap().big_tcp, None);
        assert_eq!(
            parse(with("bigTcp", json!(196_608))).unwrap().big_tcp,
            Some(196_608)
        );
        for bad in [
            json!(65_536),
            json!(600_000),
            json!(-1),
            json!("on"),
            json!([1]),
        ] {
            let err = parse(with("bigTcp", bad.clone())).unwrap_err();
            assert_eq!(err.code(), 7, "{bad}: {err}");
            assert!(err.to_string().contains("\"bigTcp\""), "{bad}: {err}");
            assert!(err.to_string().contains("65537 to 524280"), "{bad}: {err}");
        }
    }

    #[test]
    fn all_keys_are_read() {
        let conf = parse(json!({
            "cniVersion": "0.4.0", "name": "n.1", "type": "flatnet", "bridge": "flgw0", "mtu": 9000,
            "datapath": "tc", "dns": {"nameservers": ["1.1.1.1"]},
            "ipam": {"type": "flatnet-ipam"}, "somethingElse": true
        }))
        .unwrap();
        assert_eq!(conf.gateway_device, "flgw0");
        assert_eq!(conf.mtu, Some(9000));
        assert_eq!(conf.dns.nameservers, vec!["1.1.1.1"]);
    }

    #[test]
    fn bad_input_gets_the_right_code() {
        let cases: Vec<(serde_json::Value, u32, &str)> = vec![
            (with("cniVersion", json!("7.0.0")), 1, "supports"),
            (with("cniVersion", json!("")), 1, "supports"),
            (with("name", json!("")), 7, "name"),
            (with("name", json!("bad name")), 7, "name"),
            (with("name", json!("x".repeat(200))), 7, "name"),
            (with("bridge", json!("this-is-way-too-long")), 7, "bridge"),
            (with("mtu", json!(10)), 7, "mtu"),
            (with("mtu", json!(70000)), 7, "mtu"),
            (with("mtu", json!("big")), 6, "network configuration"),
            (
                with("ipam", json!({"subnet": "10.0.0.0/8"})),
                7,
                "ipam.type",
            ),
            (
                with("ipam", json!({"type": "../../bin/sh"})),
                7,
                "ipam.type",
            ),
            (with("datapath", json!("dpdk")), 6, "network configuration"),
            (with("ipMasq", json!("yes")), 6, "network configuration"),
            (with("prevResult", json!({"ips": "x"})), 6, "prevResult"),
        ];
        for (conf, code, needle) in cases {
            let err = parse(conf.clone()).unwrap_err();
            assert_eq!(err.code(), code, "{conf}: {err}");
            assert!(err.to_string().contains(needle), "{conf}: {err}");
        }
    }

    #[test]
    fn empty_and_non_json_stdin_are_decode_errors() {
        assert_eq!(NetConf::parse(b"").unwrap_err().code(), 6);
        assert_eq!(NetConf::parse(b"  \n").unwrap_err().code(), 6);
        assert_eq!(NetConf::parse(b"not json").unwrap_err().code(), 6);
        assert_eq!(NetConf::parse(b"[1,2]").unwrap_err().code(), 6);
    }

    #[test]
    fn missing_ipam_is_reported_only_when_needed() {
        let mut conf = base();
        conf.as_object_mut().unwrap().remove("ipam");
        let conf = parse(conf).unwrap();
        assert_eq!(conf.require_ipam().unwrap_err().code(), 7);
    }
}

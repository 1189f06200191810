//! What a runtime passes per attachment besides the network configuration:
//! `runtimeConfig` (the capabilities a plugin declares: `mtu`, `mac`, `ips`),
//! `args.cni` (the same keys in the config's `args`), and CNI_ARGS
//! (`KEY=VALUE;...` with the `IgnoreUnknown` convention).

use serde_json::Value;

use super::config::MTU_RANGE;
use super::error::{Error, Result};

/// A MAC address (six bytes), as the kernel takes it.
pub type Mac = [u8; 6];

/// CNI_ARGS keys flatnet understands without `IgnoreUnknown`: the
/// convention's own key, the ones kubelet, CRI-O and podman always pass,
/// `IP` (for the IPAM plugin) and `MAC` (the pod interface's address).
pub const FLATNET_CNI_ARGS: &[&str] = &[
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
    "IP",
    "MAC",
];

/// Per-attachment settings from `runtimeConfig` and `args.cni`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// `runtimeConfig.mtu`: overrides the configuration's `mtu`.
    pub mtu: Option<u32>,
    /// `runtimeConfig.mac`, else `args.cni.mac`: the pod interface's MAC.
    pub mac: Option<Mac>,
    /// `runtimeConfig.bandwidth`: which directions the bandwidth plugin,
    /// chained after flatnet, will shape.
    pub bandwidth: Bandwidth,
}

/// The directions of a pod's traffic that qdiscs on its host veth shape
/// (the bandwidth plugin's `runtimeConfig.bandwidth`, which flatnet reads
/// when its own entry in the list declares the `bandwidth` capability too).
/// The fast path leaves such traffic to the stack, which runs the qdiscs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bandwidth {
    /// `ingressRate`: into the pod (a tbf on the host veth's egress).
    pub ingress: bool,
    /// `egressRate`: out of the pod (an `ingress` qdisc on the host veth,
    /// redirecting to an ifb device with a tbf).
    pub egress: bool,
}

impl Bandwidth {
    /// Reads `runtimeConfig.bandwidth` as the bandwidth plugin does: a
    /// direction is shaped when both its rate and its burst are above zero.
    fn from_value(value: &Value) -> Result<Self> {
        if !value.is_object() {
            return Err(Error::config(format!(
                "\"runtimeConfig.bandwidth\" must be an object like {{\"ingressRate\": 1000000, \"ingressBurst\": 65536}}, not {value}"
            )));
        }
        // As Go's encoding/json (the bandwidth plugin) matches keys: the
        // exact name first, else any case. containerd's go-cni sends
        // "IngressRate", "IngressBurst", ... (its struct's field names).
        let lookup = |name: &str| -> Option<&Value> {
            value.get(name).or_else(|| {
                value.as_object().and_then(|object| {
                    object
                        .iter()
                        .find(|(key, _)| key.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v)
                })
            })
        };
        let field = |name: &str| -> Result<u64> {
            match lookup(name) {
                None | Some(Value::Null) => Ok(0),
                Some(v) => v.as_u64().ok_or_else(|| {
                    Error::config(format!(
                        "\"runtimeConfig.bandwidth.{name}\" must be a whole number of bits per second (rates) or bits (bursts), not {v}"
                    ))
                }),
            }
        };
        let (ingress_rate, ingress_burst) = (field("ingressRate")?, field("ingressBurst")?);
        let (egress_rate, egress_burst) = (field("egressRate")?, field("egressBurst")?);
        Ok(Bandwidth {
            ingress: ingress_rate > 0 && ingress_burst > 0,
            egress: egress_rate > 0 && egress_burst > 0,
        })
    }
}

impl RuntimeOptions {
    /// Reads `runtimeConfig` and `args` of a network configuration; keys
    /// flatnet does not use are left to other plugins (IPAM reads `ips`).
    pub fn from_config(runtime_config: Option<&Value>, args: Option<&Value>) -> Result<Self> {
        let mut options = RuntimeOptions::default();
        let cni_args = args.and_then(|a| a.get("cni"));
        if let Some(mac) = cni_args.and_then(|a| a.get("mac")) {
            options.mac = Some(mac_field(mac, "args.cni.mac")?);
        }
        let Some(runtime_config) = runtime_config else {
            return Ok(options);
        };
        if !runtime_config.is_object() && !runtime_config.is_null() {
            return Err(Error::decode(
                "network configuration",
                "\"runtimeConfig\" must be an object",
            ));
        }
        if let Some(mtu) = runtime_config.get("mtu").filter(|v| !v.is_null()) {
            let value = mtu
                .as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .filter(|m| MTU_RANGE.contains(m))
                .ok_or_else(|| {
                    Error::config(format!(
                        "\"runtimeConfig.mtu\" {mtu} is out of range: use {}..={}",
                        MTU_RANGE.start(),
                        MTU_RANGE.end()
                    ))
                })?;
            options.mtu = Some(value);
        }
        if let Some(mac) = runtime_config.get("mac").filter(|v| !v.is_null()) {
            options.mac = Some(mac_field(mac, "runtimeConfig.mac")?);
        }
        if let Some(bandwidth) = runtime_config.get("bandwidth").filter(|v| !v.is_null()) {
            options.bandwidth = Bandwidth::from_value(bandwidth)?;
        }
        Ok(options)
    }
}

fn mac_field(value: &Value, field: &str) -> Result<Mac> {
    let text = value.as_str().ok_or_else(|| {
        Error::config(format!(
            "\"{field}\" must be a string like \"02:42:ac:11:00:02\", not {value}"
        ))
    })?;
    parse_unicast_mac(text).map_err(|why| Error::config(format!("\"{field}\" {text:?} {why}")))
}

/// Six hex bytes separated by ':' or '-' (the forms runtimes use), which must
/// be a unicast, non-zero address: the pod's interface answers to it.
pub fn parse_unicast_mac(text: &str) -> std::result::Result<Mac, String> {
    let separator = if text.contains('-') { '-' } else { ':' };
    let parts: Vec<&str> = text.split(separator).collect();
    let well_formed = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
    if !well_formed {
        return Err("is not a MAC address: write six hex bytes, e.g. 02:42:ac:11:00:02".into());
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(&parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|e| e.to_string())?;
    }
    if mac[0] & 1 == 1 {
        return Err(
            "is a multicast address; an interface needs a unicast one (even first byte)".into(),
        );
    }
    if mac == [0; 6] {
        return Err("is all zeros; give the interface a real address".into());
    }
    Ok(mac)
}

/// True for the values the CNI convention reads as true for `IgnoreUnknown`.
fn truthy(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" | "" => Ok(false),
        _ => Err(Error::invalid_env(
            "CNI_ARGS",
            format!("{key}={value}: use 1/true or 0/false"),
        )),
    }
}

/// Refuses CNI_ARGS keys not in `known` unless `IgnoreUnknown` is true, as
/// the reference plugins do: a typo must not be silently dropped.
pub fn check_cni_args(args: &[(String, String)], known: &[&str]) -> Result<()> {
    let mut ignore_unknown = false;
    for (key, value) in args {
        if key == "IgnoreUnknown" {
            ignore_unknown = truthy(key, value)?;
        }
    }
    if ignore_unknown {
        return Ok(());
    }
    let unknown: Vec<&str> = args
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !known.contains(k))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(Error::UnsupportedField {
        field: format!("CNI_ARGS {}", unknown.join(", ")),
        value: "given".into(),
        hint: format!(
            "this plugin knows {}; add IgnoreUnknown=1 to CNI_ARGS to pass other keys through",
            known.join(", ")
        ),
    })
}

/// `MAC=` in CNI_ARGS, if given.
pub fn cni_args_mac(args: &[(String, String)]) -> Result<Option<Mac>> {
    args.iter()
        .find(|(k, _)| k == "MAC")
        .map(|(_, value)| {
            parse_unicast_mac(value)
                .map_err(|why| Error::invalid_env("CNI_ARGS", format!("MAC={value} {why}")))
        })
        .transpose()
}

/// One `{containerID, ifname}` of `cni.dev/valid-attachments` (GC, 1.1.0).
#[derive(Debug, Clone, serde::Deserialize, PartialEq, Eq)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

#[derive(serde::Deserialize)]
struct GcInput {
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

/// The attachments the runtime still uses, from a GC's stdin.
pub fn valid_attachments(stdin: &[u8]) -> Result<Vec<Attachment>> {
    let input: GcInput =
        serde_json::from_slice(stdin).map_err(|e| Error::decode("the GC input", e))?;
    require_valid_attachments(input.valid_attachments)
}

/// Checks the GC list both plugins read: it must be there (read as "none is
/// valid", a missing list would wipe the network) and name each attachment.
pub fn require_valid_attachments(list: Option<Vec<Attachment>>) -> Result<Vec<Attachment>> {
    let list = list.ok_or_else(|| {
        Error::config(
            "GC needs \"cni.dev/valid-attachments\" (a list of {\"containerID\", \"ifname\"}, empty when none is valid)",
        )
    })?;
    if let Some((index, _)) = list
        .iter()
        .enumerate()
        .find(|(_, a)| a.container_id.is_empty() || a.ifname.is_empty())
    {
        return Err(Error::config(format!(
            "\"cni.dev/valid-attachments\"[{index}] has an empty \"containerID\" or \"ifname\""
        )));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn runtime_config_mtu_and_mac_are_read_and_checked() {
        let o = RuntimeOptions::from_config(
            Some(&json!({"mtu": 1400, "mac": "02:42:AC:11:00:02", "ips": ["10.0.0.5/24"]})),
            None,
        )
        .unwrap();
        assert_eq!(o.mtu, Some(1400));
        assert_eq!(o.mac, Some([2, 0x42, 0xac, 0x11, 0, 2]));
        for (rc, needle) in [
            (json!({"mtu": 10}), "runtimeConfig.mtu"),
            (json!({"mtu": 70000}), "runtimeConfig.mtu"),
            (json!({"mtu": -1}), "runtimeConfig.mtu"),
            (json!({"mtu": "big"}), "runtimeConfig.mtu"),
            (json!({"mac": "nope"}), "runtimeConfig.mac"),
            (json!({"mac": "03:00:00:00:00:01"}), "multicast"),
            (json!({"mac": "00:00:00:00:00:00"}), "zeros"),
            (json!({"mac": 12}), "runtimeConfig.mac"),
            (json!({"mac": "02:00:00:00:00:0g"}), "runtimeConfig.mac"),
            (json!({"mac": "2:0:0:0:0:1"}), "runtimeConfig.mac"),
        ] {
            let err = RuntimeOptions::from_config(Some(&rc), None).unwrap_err();
            assert_eq!(err.code(), 7, "{rc}: {err}");
            assert!(err.to_string().contains(needle), "{rc}: {err}");
        }
        let err = RuntimeOptions::from_config(Some(&json!([1])), None).unwrap_err();
        assert_eq!(err.code(), 6);
    }

    #[test]
    fn runtime_config_bandwidth_says_which_directions_are_shaped() {
        let shaping = |rc: serde_json::Value| RuntimeOptions::from_config(Some(&rc), None);
        let both = json!({"bandwidth": {"ingressRate": 4_000_000, "ingressBurst": 524_288,
            "egressRate": 1_000_000, "egressBurst": 65_536}});
        assert_eq!(
            shaping(both).unwrap().bandwidth,
            Bandwidth {
                ingress: true,
                egress: true
            }
        );
        // The bandwidth plugin shapes a direction only with a rate and a burst.
        let egress_rate_only = json!({"bandwidth": {"egressRate": 1_000_000, "ingressRate": 5,
            "ingressBurst": 7}});
        assert_eq!(
            shaping(egress_rate_only).unwrap().bandwidth,
            Bandwidth {
                ingress: true,
                egress: false
            }
        );
        // containerd's go-cni sends Go field names; the plugin matches any case.
        let containerd = json!({"bandwidth": {"IngressRate": 4_000_000,
            "IngressBurst": 4_294_967_295_u64, "EgressRate": 0, "EgressBurst": 0}});
        assert_eq!(
            shaping(containerd).unwrap().bandwidth,
            Bandwidth {
                ingress: true,
                egress: false
            }
        );
        assert_eq!(shaping(json!({})).unwrap().bandwidth, Bandwidth::default());
        assert_eq!(
            shaping(json!({"bandwidth": null})).unwrap().bandwidth,
            Bandwidth::default()
        );
        for (rc, needle) in [
            (
                json!({"bandwidth": 5}),
                "runtimeConfig.bandwidth\" must be an object",
            ),
            (
                json!({"bandwidth": {"egressRate": -1}}),
                "bandwidth.egressRate",
            ),
            (
                json!({"bandwidth": {"ingressBurst": "64k"}}),
                "bandwidth.ingressBurst",
            ),
        ] {
            let err = shaping(rc.clone()).unwrap_err();
            assert_eq!(err.code(), 7, "{rc}: {err}");
            assert!(err.to_string().contains(needle), "{rc}: {err}");
        }
    }

    #[test]
    fn runtime_config_mac_wins_over_args_cni() {
        let args = json!({"cni": {"mac": "02:00:00:00:00:01"}});
        let o = RuntimeOptions::from_config(None, Some(&args)).unwrap();
        assert_eq!(o.mac, Some([2, 0, 0, 0, 0, 1]));
        let o =
            RuntimeOptions::from_config(Some(&json!({"mac": "02-00-00-00-00-02"})), Some(&args))
                .unwrap();
        assert_eq!(o.mac, Some([2, 0, 0, 0, 0, 2]));
        let err =
            RuntimeOptions::from_config(None, Some(&json!({"cni": {"mac": "x"}}))).unwrap_err();
        assert!(err.to_string().contains("args.cni.mac"), "{err}");
    }

    #[test]
    fn unknown_cni_args_need_ignore_unknown() {
        let known = FLATNET_CNI_ARGS;
        check_cni_args(
            &pairs(&[("K8S_POD_NAME", "web"), ("IP", "10.0.0.2")]),
            known,
        )
        .unwrap();
        let err =
            check_cni_args(&pairs(&[("FOO", "1"), ("K8S_POD_NAME", "x")]), known).unwrap_err();
        assert_eq!(err.code(), 2);
        assert!(err.to_string().contains("FOO"), "{err}");
        assert!(err.to_string().contains("IgnoreUnknown"), "{err}");
        for yes in ["1", "true", "TRUE", "True"] {
            check_cni_args(&pairs(&[("IgnoreUnknown", yes), ("FOO", "1")]), known).unwrap();
        }
        let err =
            check_cni_args(&pairs(&[("IgnoreUnknown", "0"), ("FOO", "1")]), known).unwrap_err();
        assert_eq!(err.code(), 2);
        let err = check_cni_args(&pairs(&[("IgnoreUnknown", "maybe")]), known).unwrap_err();
        assert_eq!(err.code(), 4);
    }

    #[test]
    fn cni_args_mac_is_validated() {
        assert_eq!(cni_args_mac(&pairs(&[("A", "b")])).unwrap(), None);
        assert_eq!(
            cni_args_mac(&pairs(&[("MAC", "02:00:00:00:00:09")])).unwrap(),
            Some([2, 0, 0, 0, 0, 9])
        );
        let err = cni_args_mac(&pairs(&[("MAC", "ff:ff:ff:ff:ff:ff")])).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("MAC="), "{err}");
    }

    #[test]
    fn valid_attachments_are_read_and_required() {
        let list = valid_attachments(
            br#"{"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}], "name": "n"}"#,
        )
        .unwrap();
        assert_eq!(
            list,
            vec![Attachment {
                container_id: "a".into(),
                ifname: "eth0".into()
            }]
        );
        assert!(
            valid_attachments(br#"{"cni.dev/valid-attachments": []}"#)
                .unwrap()
                .is_empty()
        );
        assert_eq!(valid_attachments(b"{}").unwrap_err().code(), 7);
        let err = valid_attachments(
            br#"{"cni.dev/valid-attachments": [{"containerID": "a", "ifname": ""}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("[0]"), "{err}");
        assert_eq!(
            valid_attachments(br#"{"cni.dev/valid-attachments": [{"containerID": 1}]}"#)
                .unwrap_err()
                .code(),
            6
        );
    }
}

//! `runtimeConfig.portMappings`: a Pod's hostPorts, as runtimes pass them to
//! a plugin declaring the `portMappings` capability (the reference portmap
//! plugin's, which flatnet's own entry declares when it serves hostPorts
//! in BPF). Read as portmap reads them, and checked harder: a mapping it
//! cannot serve is an error that says which and why, not a silent gap.

use std::net::IpAddr;

use serde_json::Value;

use super::error::{Error, Result};

/// One hostPort: `host_port` on `host_ip` (None: every address) to
/// `container_port` of the pod, for IP `protocol` (6, 17 or 132).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: u8,
    pub host_ip: Option<IpAddr>,
}

/// Reads the `portMappings` array (kubelet's entries: `hostPort`,
/// `containerPort`, `protocol` "tcp"/"udp"/"sctp", `hostIP` or "").
pub fn port_mappings(value: &Value) -> Result<Vec<PortMapping>> {
    let entries = value.as_array().ok_or_else(|| {
        Error::config(format!(
            "\"runtimeConfig.portMappings\" must be an array like [{{\"hostPort\": 8080, \"containerPort\": 80, \"protocol\": \"tcp\"}}], not {value}"
        ))
    })?;
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| mapping(index, entry))
        .collect()
}

/// `entry`'s key `name`, its case ignored as Go's encoding/json (and so
/// portmap) ignores it: containerd's go-cni passes its `PortMapping`
/// struct, whose fields have no JSON names (`"HostPort"`, `"HostIP"`).
fn get<'a>(entry: &'a Value, name: &str) -> Option<&'a Value> {
    entry.get(name).or_else(|| {
        entry
            .as_object()?
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    })
}

fn mapping(index: usize, entry: &Value) -> Result<PortMapping> {
    let field = |name: &str| format!("runtimeConfig.portMappings[{index}].{name}");
    let port = |name: &str| -> Result<u16> {
        get(entry, name)
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
            .ok_or_else(|| {
                Error::config(format!(
                    "\"{}\" must be a port number from 1 to 65535, not {}",
                    field(name),
                    get(entry, name).unwrap_or(&Value::Null)
                ))
            })
    };
    let protocol = match get(entry, "protocol") {
        None | Some(Value::Null) => 6,
        Some(Value::String(name)) => match name.to_ascii_lowercase().as_str() {
            "" | "tcp" => 6,
            "udp" => 17,
            "sctp" => 132,
            _ => {
                return Err(Error::config(format!(
                    "\"{}\" {name:?} is not a protocol a hostPort has: use \"tcp\", \"udp\" or \"sctp\"",
                    field("protocol")
                )));
            }
        },
        Some(other) => {
            return Err(Error::config(format!(
                "\"{}\" must be a string (\"tcp\", \"udp\" or \"sctp\"), not {other}",
                field("protocol")
            )));
        }
    };
    let host_ip = match get(entry, "hostIP") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) if text.is_empty() => None,
        Some(Value::String(text)) => {
            let ip: IpAddr = text.parse().map_err(|_| {
                Error::config(format!(
                    "\"{}\" {text:?} is not an IP address: give one of the node's addresses, or \"\" for all of them",
                    field("hostIP")
                ))
            })?;
            Some(ip).filter(|ip| !ip.is_unspecified())
        }
        Some(other) => {
            return Err(Error::config(format!(
                "\"{}\" must be a string, not {other}",
                field("hostIP")
            )));
        }
    };
    Ok(PortMapping {
        host_port: port("hostPort")?,
        container_port: port("containerPort")?,
        protocol,
        host_ip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;
    use serde_json::json;

    #[test]
    fn kubelets_port_mappings_are_read() {
        let mappings = port_mappings(&json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 53, "containerPort": 5353, "protocol": "UDP", "hostIP": "127.0.0.1"},
            {"hostPort": 9000, "containerPort": 9000, "hostIP": ""},
            {"hostPort": 9001, "containerPort": 9001, "protocol": "sctp", "hostIP": "0.0.0.0"},
        ]))
        .unwrap();
        assert_eq!(
            mappings,
            [
                PortMapping {
                    host_port: 8080,
                    container_port: 80,
                    protocol: 6,
                    host_ip: None
                },
                PortMapping {
                    host_port: 53,
                    container_port: 5353,
                    protocol: 17,
                    host_ip: Some("127.0.0.1".parse().unwrap())
                },
                PortMapping {
                    host_port: 9000,
                    container_port: 9000,
                    protocol: 6,
                    host_ip: None
                },
                PortMapping {
                    host_port: 9001,
                    container_port: 9001,
                    protocol: 132,
                    host_ip: None
                },
            ]
        );
    }

    #[test]
    fn containerds_go_field_names_are_read_as_portmap_reads_them() {
        // containerd 1.6's go-cni, as the real-cluster suite saw it.
        let mappings = port_mappings(&json!([
            {"HostPort": 54321, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "127.0.0.1"}
        ]))
        .unwrap();
        assert_eq!(
            mappings,
            [PortMapping {
                host_port: 54321,
                container_port: 80,
                protocol: 6,
                host_ip: Some("127.0.0.1".parse().unwrap())
            }]
        );
    }

    #[test]
    fn a_mapping_that_cannot_be_served_says_which_field_to_fix() {
        for (value, says) in [
            (json!({"hostPort": 8080}), "must be an array"),
            (
                json!([{"hostPort": 0, "containerPort": 80}]),
                "[0].hostPort",
            ),
            (
                json!([{"hostPort": 70000, "containerPort": 80}]),
                "[0].hostPort",
            ),
            (
                json!([{"hostPort": 80, "containerPort": "80"}]),
                "[0].containerPort",
            ),
            (
                json!([{"hostPort": 1, "containerPort": 1}, {"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]),
                "[1].protocol",
            ),
            (
                json!([{"hostPort": 80, "containerPort": 80, "hostIP": "node-1"}]),
                "[0].hostIP",
            ),
        ] {
            let err = port_mappings(&value).unwrap_err();
            assert_eq!(err.code(), code::INVALID_CONFIG, "{value}");
            let text = err.to_string();
            assert!(
                text.contains("portMappings") && text.contains(says),
                "{value}: {text}"
            );
        }
    }
}

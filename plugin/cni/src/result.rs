//! The CNI result: what ADD prints and what CHECK/DEL receive as `prevResult`.
//!
//! One in-memory shape (1.x, with the 1.1.0 optional fields) is read from and
//! written to every supported version: 0.3.x/0.4.0 add `version` to each IP.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::version::SpecVersion;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CniResult {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The netns path for container interfaces; absent for host interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// 1.1.0
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// 1.1.0: the socket an interface is reached through (vhost-user and
    /// the like); kept so an earlier plugin's interface passes through.
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    /// 1.1.0: the PCI address of a device interface (passed through too).
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IpConfig {
    /// 0.3.x/0.4.0 only: "4" or "6".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub address: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Route {
    pub dst: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>) -> Self {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }

    pub fn is_default(&self) -> bool {
        self.dst.prefix() == 0
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

impl CniResult {
    /// Reads a result of any supported version (an IPAM answer or a `prevResult`).
    pub fn from_value(value: &serde_json::Value, what: &str) -> Result<Self> {
        let result: CniResult =
            serde_json::from_value(value.clone()).map_err(|e| Error::decode(what, e))?;
        if !result.cni_version.is_empty() {
            SpecVersion::parse(&result.cni_version)?;
        }
        for ip in &result.ips {
            if let Some(index) = ip.interface
                && index >= result.interfaces.len()
                && !result.interfaces.is_empty()
            {
                return Err(Error::decode(
                    what,
                    format!(
                        "ip {} names interface {index}, but there are {}",
                        ip.address,
                        result.interfaces.len()
                    ),
                ));
            }
        }
        Ok(result)
    }

    /// This plugin's result placed after an earlier plugin's (`prevResult`,
    /// when it runs later in a chain): the earlier interfaces, IPs, routes
    /// and DNS are kept, its own appended with their interface indexes
    /// shifted past the earlier interfaces.
    pub fn after(self, prev: &CniResult) -> CniResult {
        let shift = prev.interfaces.len();
        let mut merged = prev.clone();
        merged.cni_version = self.cni_version;
        merged.interfaces.extend(self.interfaces);
        merged.ips.extend(self.ips.into_iter().map(|ip| IpConfig {
            interface: ip.interface.map(|index| index + shift),
            ..ip
        }));
        for route in self.routes {
            if !merged.routes.contains(&route) {
                merged.routes.push(route);
            }
        }
        if merged.dns.is_empty() {
            merged.dns = self.dns;
        }
        merged
    }

    /// The result as JSON in `version`'s shape.
    pub fn to_version(&self, version: SpecVersion) -> serde_json::Value {
        let mut out = self.clone();
        out.cni_version = version.as_str().to_string();
        for ip in &mut out.ips {
            ip.version = version
                .ips_carry_version()
                .then(|| if ip.address.is_ipv4() { "4" } else { "6" }.to_string());
        }
        if version < SpecVersion::V1_1_0 {
            for iface in &mut out.interfaces {
                (iface.mtu, iface.socket_path, iface.pci_id) = (None, None, None);
            }
            for route in &mut out.routes {
                (
                    route.mtu,
                    route.advmss,
                    route.priority,
                    route.table,
                    route.scope,
                ) = (None, None, None, None, None);
            }
        }
        // Serializing plain data with string keys cannot fail.
        serde_json::to_value(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> CniResult {
        CniResult {
            cni_version: "1.0.0".into(),
            interfaces: vec![
                Interface {
                    name: "flabc".into(),
                    mac: Some("02:00:00:00:00:01".into()),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("02:00:00:00:00:02".into()),
                    sandbox: Some("/run/netns/p".into()),
                    mtu: Some(1500),
                    ..Default::default()
                },
            ],
            ips: vec![IpConfig {
                version: None,
                address: "10.42.0.5/16".parse().unwrap(),
                gateway: Some("10.42.0.1".parse().unwrap()),
                interface: Some(1),
            }],
            routes: vec![Route::new(
                "0.0.0.0/0".parse().unwrap(),
                Some("10.42.0.1".parse().unwrap()),
            )],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn writes_the_1_0_shape() {
        let v = sample().to_version(SpecVersion::V1_0_0);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["ips"][0]["address"], "10.42.0.5/16");
        assert_eq!(v["ips"][0]["interface"], 1);
        assert!(v["ips"][0].get("version").is_none());
        assert!(
            v["interfaces"][1].get("mtu").is_none(),
            "mtu is a 1.1.0 field"
        );
        assert_eq!(v["interfaces"][1]["sandbox"], "/run/netns/p");
        assert_eq!(v["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(v["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn writes_the_0_4_shape_with_ip_versions() {
        let v = sample().to_version(SpecVersion::parse("0.4.0").unwrap());
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["cniVersion"], "0.4.0");
    }

    #[test]
    fn reads_back_what_it_writes_in_every_version() {
        for version in crate::version::SUPPORTED {
            let version = SpecVersion::parse(version).unwrap();
            let written = sample().to_version(version);
            let read = CniResult::from_value(&written, "prevResult").unwrap();
            assert_eq!(read.ips[0].address, sample().ips[0].address);
            assert_eq!(read.interfaces.len(), 2);
        }
    }

    #[test]
    fn a_result_after_a_prev_result_keeps_it_and_shifts_indexes() {
        let prev = CniResult::from_value(
            &json!({
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "net1", "sandbox": "/run/netns/p"}],
                "ips": [{"address": "192.168.9.2/24", "interface": 0}, {"address": "192.168.10.2/24"}],
                "routes": [{"dst": "192.168.0.0/16"}],
                "dns": {"nameservers": ["192.168.9.53"]}
            }),
            "prevResult",
        )
        .unwrap();
        let merged = sample().after(&prev);
        assert_eq!(merged.interfaces.len(), 3);
        assert_eq!(merged.interfaces[0].name, "net1");
        assert_eq!(merged.interfaces[2].name, "eth0");
        assert_eq!(merged.ips.len(), 3);
        assert_eq!(merged.ips[0].interface, Some(0));
        assert_eq!(merged.ips[1].interface, None);
        assert_eq!(
            merged.ips[2].interface,
            Some(2),
            "1 + one earlier interface"
        );
        assert_eq!(merged.ips[2].address, sample().ips[0].address);
        assert_eq!(merged.routes.len(), 2);
        assert_eq!(merged.dns.nameservers, vec!["192.168.9.53"]);
        assert_eq!(merged.cni_version, "1.0.0");
        // An empty earlier DNS takes ours; an empty prevResult changes nothing.
        let merged = sample().after(&CniResult::default());
        assert_eq!(merged, sample());
    }

    #[test]
    fn the_1_1_interface_fields_pass_through_and_go_before_1_1() {
        let prev = CniResult::from_value(
            &json!({"cniVersion": "1.1.0", "interfaces": [{"name": "vhu0", "socketPath": "/run/vhu0.sock", "pciID": "0000:00:02.0", "mtu": 9000}]}),
            "prevResult",
        )
        .unwrap();
        let merged = sample().after(&prev);
        let v = merged.to_version(SpecVersion::V1_1_0);
        assert_eq!(v["interfaces"][0]["socketPath"], "/run/vhu0.sock");
        assert_eq!(v["interfaces"][0]["pciID"], "0000:00:02.0");
        assert_eq!(v["interfaces"][0]["mtu"], 9000);
        let v = merged.to_version(SpecVersion::V1_0_0);
        assert!(v["interfaces"][0].get("socketPath").is_none());
        assert!(v["interfaces"][0].get("pciID").is_none());
    }

    #[test]
    fn reads_a_host_local_answer() {
        let answer = json!({
            "cniVersion": "0.4.0",
            "ips": [{"version": "4", "address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
            "dns": {}
        });
        let r = CniResult::from_value(&answer, "IPAM result").unwrap();
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert!(r.routes.is_empty());
    }

    #[test]
    fn refuses_garbage() {
        assert_eq!(
            CniResult::from_value(&json!({"ips": 3}), "x")
                .unwrap_err()
                .code(),
            6
        );
        assert_eq!(
            CniResult::from_value(&json!({"ips": [{"address": "10.0.0.300/8"}]}), "x")
                .unwrap_err()
                .code(),
            6
        );
        assert_eq!(
            CniResult::from_value(&json!({"cniVersion": "9.9.9"}), "x")
                .unwrap_err()
                .code(),
            1
        );
        let dangling = json!({"interfaces": [{"name": "a"}], "ips": [{"address": "10.0.0.1/8", "interface": 4}]});
        assert_eq!(CniResult::from_value(&dangling, "x").unwrap_err().code(), 6);
    }
}

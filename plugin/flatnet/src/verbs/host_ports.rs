//! ADD's hostPorts, served in BPF: the frontends `runtimeConfig.portMappings`
//! asks for, each on its address (or every node address of its family, a
//! mapping without `hostIP`), leading to the pod's address of that family (see
//! `flatnet_datapath::bpf::HostPort`). What BPF cannot serve is refused here,
//! before anything is made.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use flatnet_cni::port_mappings::PortMapping;
use flatnet_datapath::bpf::HostPort;

use crate::error::{Error, Result};

/// The hostPort frontends of `mappings` for a pod with `addresses`.
pub fn plan(mappings: &[PortMapping], addresses: &[IpAddr]) -> Result<Vec<HostPort>> {
    let mut frontends = Vec::new();
    for mapping in mappings {
        if mapping.protocol != 6 && mapping.protocol != 17 {
            return Err(Error::config(format!(
                "hostPort {}: flatnet serves TCP and UDP hostPorts in BPF, not SCTP; chain the portmap plugin for this pod's network instead",
                mapping.host_port
            )));
        }
        let before = frontends.len();
        for pod in addresses {
            // Without hostIP: every node address NodePorts answer on, and
            // loopback (portmap's `snat` serves the node's own clients there).
            let on: &[IpAddr] = match mapping.host_ip {
                Some(ip) if ip.is_ipv4() != pod.is_ipv4() => continue,
                Some(ip) => &[ip],
                None if pod.is_ipv4() => {
                    &[Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into()]
                }
                None => &[Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into()],
            };
            frontends.extend(on.iter().map(|address| HostPort {
                address: *address,
                port: mapping.host_port,
                protocol: mapping.protocol,
                backend: SocketAddr::new(*pod, mapping.container_port),
            }));
        }
        if frontends.len() == before
            && let Some(ip) = mapping.host_ip
        {
            return Err(Error::config(format!(
                "hostPort {} has hostIP {ip}, but the pod has no address of that family: give a hostIP of the pod's family, or none",
                mapping.host_port
            )));
        }
    }
    frontends.sort();
    frontends.dedup();
    Ok(frontends)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(host_port: u16, protocol: u8, host_ip: Option<&str>) -> PortMapping {
        PortMapping {
            host_port,
            container_port: 80,
            protocol,
            host_ip: host_ip.map(|ip| ip.parse().unwrap()),
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn a_mapping_without_host_ip_serves_every_family_the_pod_has_and_loopback() {
        let planned = plan(&[mapping(8080, 6, None)], &ips(&["10.1.0.5", "fd00::5"])).unwrap();
        let shown: Vec<(String, String)> = planned
            .iter()
            .map(|p| (p.address.to_string(), p.backend.to_string()))
            .collect();
        assert_eq!(
            shown,
            [
                ("0.0.0.0".into(), "10.1.0.5:80".into()),
                ("127.0.0.1".into(), "10.1.0.5:80".into()),
                ("::".into(), "[fd00::5]:80".into()),
                ("::1".into(), "[fd00::5]:80".into()),
            ]
        );
    }

    #[test]
    fn a_host_ip_serves_its_family_only_and_must_have_one() {
        let dual = ips(&["10.1.0.5", "fd00::5"]);
        let planned = plan(&[mapping(53, 17, Some("127.0.0.1"))], &dual).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].address, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(planned[0].backend, "10.1.0.5:80".parse().unwrap());
        let err = plan(&[mapping(53, 17, Some("fd00::1"))], &ips(&["10.1.0.5"])).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(
            err.to_string().contains("no address of that family"),
            "{err}"
        );
    }

    #[test]
    fn what_bpf_cannot_serve_is_refused_before_anything_is_made() {
        let pod = ips(&["10.1.0.5"]);
        let err = plan(&[mapping(9000, 132, None)], &pod).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("not SCTP"), "{err}");
        assert_eq!(plan(&[], &pod).unwrap(), []);
    }
}

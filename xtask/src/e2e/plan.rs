//! The cluster's addresses and names, in one place.
//!
//! Every machine of the cluster lives in network namespaces of its own,
//! joined by one bridge on the control plane machine; none of them is
//! connected to the host's network namespace, and none has a default
//! route, so nothing of the cluster's can leave the machine. The guard
//! (`guard.rs`) drops and counts the cluster's ranges on the real uplink
//! anyway.

use std::net::Ipv4Addr;
use std::path::PathBuf;

/// The underlay: the control plane at .1, node i at .(10 + i).
pub const UNDERLAY: &str = "172.29.0.0/24";
pub const UNDERLAY_PREFIX: u8 = 24;
pub const CONTROL_PLANE_ADDRESS: Ipv4Addr = Ipv4Addr::new(172, 29, 0, 1);
/// The control plane machine's bridge: the cluster's one L2 segment.
pub const BRIDGE: &str = "cluster0";
pub const API_PORT: u16 = 6443;

/// Pod CIDRs: kube-controller-manager gives each node a /24 of it.
pub const CLUSTER_CIDR: &str = "10.201.0.0/16";
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's ClusterIP (the first of the range).
pub const API_SERVICE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The cluster DNS Service's ClusterIP (kubelet's clusterDNS).
pub const DNS_SERVICE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const DNS_DOMAIN: &str = "cluster.local";

/// The metadata address kubelet's cloud code asks: dropped by the guard too.
pub const LINK_LOCAL: &str = "169.254.0.0/16";

/// Names start with this: the leak check and a crashed run's clean-up find
/// the cluster's objects by it.
pub const PREFIX: &str = "fe2e";

pub struct Plan {
    /// State of this run (removed at the end).
    pub dir: PathBuf,
    /// Logs and reports of this run (kept).
    pub logs: PathBuf,
    pub nodes: u8,
}

impl Plan {
    pub fn control_plane_name(&self) -> String {
        format!("{PREFIX}-control-plane")
    }

    pub fn node_name(&self, index: u8) -> String {
        format!("{PREFIX}-node-{index}")
    }

    pub fn node_address(&self, index: u8) -> Ipv4Addr {
        Ipv4Addr::new(172, 29, 0, 10 + index)
    }

    pub fn api_server_url(&self) -> String {
        format!("https://{CONTROL_PLANE_ADDRESS}:{API_PORT}")
    }

    /// Every range of the cluster's: what must never leave the machine.
    pub fn ranges() -> [&'static str; 4] {
        [UNDERLAY, CLUSTER_CIDR, SERVICE_CIDR, LINK_LOCAL]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_inside_their_ranges() {
        let plan = Plan {
            dir: PathBuf::new(),
            logs: PathBuf::new(),
            nodes: 2,
        };
        let underlay: ipnetwork::Ipv4Network = UNDERLAY.parse().unwrap();
        assert!(underlay.contains(CONTROL_PLANE_ADDRESS));
        for i in 1..=plan.nodes {
            assert!(underlay.contains(plan.node_address(i)));
        }
        let services: ipnetwork::Ipv4Network = SERVICE_CIDR.parse().unwrap();
        assert!(services.contains(API_SERVICE_ADDRESS) && services.contains(DNS_SERVICE_ADDRESS));
        let pods: ipnetwork::Ipv4Network = CLUSTER_CIDR.parse().unwrap();
        assert!(!pods.overlaps(services) && !pods.overlaps(underlay));
    }
}

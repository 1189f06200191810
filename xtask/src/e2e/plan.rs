//! The cluster's addresses and names, in one place.
//!
//! Every machine of the cluster lives in network namespaces of its own,
//! joined by one bridge on the control plane machine; none of them is
//! connected to the host's network namespace, and none has a default
//! route, so nothing of the cluster's can leave the machine. The guard
//! (`guard.rs`) drops and counts the cluster's ranges on the real uplink
//! anyway.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

/// A dual-stack cluster's IPv6 side (`--dual-stack`): IPv4 stays the
/// primary family (the first of every list), as on most dual-stack
/// clusters.
pub const UNDERLAY6: &str = "fd29::/64";
pub const UNDERLAY6_PREFIX: u8 = 64;
pub const CONTROL_PLANE_ADDRESS6: Ipv6Addr = Ipv6Addr::new(0xfd29, 0, 0, 0, 0, 0, 0, 1);
/// A /64 of it per node.
pub const CLUSTER_CIDR6: &str = "fd01:201::/56";
pub const NODE_CIDR_MASK6: u8 = 64;
pub const SERVICE_CIDR6: &str = "fd96::/112";

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
    /// IPv4 and IPv6 (IPv4 alone when false).
    pub dual_stack: bool,
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

    /// The node's `topology.kubernetes.io/zone`: three zones, taken in
    /// turn, so 3 nodes make the three zones the Traffic Distribution
    /// specs ask for and 6 nodes two nodes in each.
    pub fn zone(&self, index: u8) -> String {
        format!("{PREFIX}-zone-{}", (index - 1) % 3)
    }

    /// The node's IPv6 address on the underlay (dual-stack clusters).
    pub fn node_address6(&self, index: u8) -> Ipv6Addr {
        Ipv6Addr::new(0xfd29, 0, 0, 0, 0, 0, 0, 10 + u16::from(index))
    }

    /// The node's addresses, IPv4 first (kubelet's `--node-ip`).
    pub fn node_addresses(&self, index: u8) -> Vec<IpAddr> {
        let mut addresses = vec![IpAddr::V4(self.node_address(index))];
        if self.dual_stack {
            addresses.push(IpAddr::V6(self.node_address6(index)));
        }
        addresses
    }

    /// `--cluster-cidr` (kube-controller-manager, kube-proxy).
    pub fn cluster_cidrs(&self) -> String {
        self.per_family(CLUSTER_CIDR, CLUSTER_CIDR6)
    }

    /// `--service-cluster-ip-range`.
    pub fn service_cidrs(&self) -> String {
        self.per_family(SERVICE_CIDR, SERVICE_CIDR6)
    }

    fn per_family(&self, ipv4: &str, ipv6: &str) -> String {
        if self.dual_stack {
            format!("{ipv4},{ipv6}")
        } else {
            ipv4.to_string()
        }
    }

    pub fn api_server_url(&self) -> String {
        format!("https://{CONTROL_PLANE_ADDRESS}:{API_PORT}")
    }

    /// Every range of the cluster's, of both families whatever the run:
    /// what must never leave the machine.
    pub fn ranges() -> [&'static str; 7] {
        [
            UNDERLAY,
            CLUSTER_CIDR,
            SERVICE_CIDR,
            LINK_LOCAL,
            UNDERLAY6,
            CLUSTER_CIDR6,
            SERVICE_CIDR6,
        ]
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
            dual_stack: true,
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
        let underlay6: ipnetwork::Ipv6Network = UNDERLAY6.parse().unwrap();
        assert!(underlay6.contains(CONTROL_PLANE_ADDRESS6));
        for i in 1..=plan.nodes {
            assert!(underlay6.contains(plan.node_address6(i)));
            assert_eq!(plan.node_addresses(i).len(), 2);
        }
        let pods6: ipnetwork::Ipv6Network = CLUSTER_CIDR6.parse().unwrap();
        let services6: ipnetwork::Ipv6Network = SERVICE_CIDR6.parse().unwrap();
        assert!(pods6.prefix() < NODE_CIDR_MASK6);
        assert!(!pods6.overlaps(services6) && !pods6.overlaps(underlay6));
        assert_eq!(
            plan.service_cidrs(),
            format!("{SERVICE_CIDR},{SERVICE_CIDR6}")
        );
        let ipv4_only = Plan {
            dual_stack: false,
            ..plan
        };
        assert_eq!(ipv4_only.cluster_cidrs(), CLUSTER_CIDR);
        assert_eq!(ipv4_only.node_addresses(1).len(), 1);
    }
}

//! The node's kube-proxy (`KubeProxy`): its mode and what it was told of
//! the cluster, the settings both modes' rules are written from.

use std::net::IpAddr;

/// How kube-proxy programs the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
}

/// The node's kube-proxy: its mode and what it was told about the cluster.
pub struct KubeProxy {
    pub mode: Mode,
    /// `--cluster-cidr`, one per family.
    pub cluster_cidr_v4: String,
    pub cluster_cidr_v6: String,
    /// The Service CIDRs (nftables mode drops traffic to unallocated ones).
    pub service_cidr_v4: String,
    pub service_cidr_v6: String,
    /// The node's addresses that accept NodePorts (nftables' nodeport-ips;
    /// iptables mode matches any local address).
    pub node_addresses: Vec<IpAddr>,
}

/// The mark kube-proxy sets on what it masquerades.
pub(crate) const MASQ_MARK: &str = "0x4000";

impl KubeProxy {
    /// `--cluster-cidr` of one family.
    pub(crate) fn cluster_cidr(&self, v6: bool) -> &str {
        if v6 {
            &self.cluster_cidr_v6
        } else {
            &self.cluster_cidr_v4
        }
    }
}

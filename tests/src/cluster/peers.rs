//! What the agents learn of the nodes: each node's [`NodeSpec`], and where
//! they learn it from ([`Peers`]).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// What a peer file or Node object says about one node.
#[derive(Clone)]
pub struct NodeSpec {
    pub name: String,
    pub index: u8,
    /// None: no pod CIDR allocated yet.
    pub pod_cidr: Option<String>,
    /// Dual-stack: also fd30::<index> on the underlay and pod CIDR
    /// fd44:0:0:<index>::/64.
    pub dual_stack: bool,
    /// The underlay segment the node is on: 0, the switch's, or another
    /// one behind the switch namespace acting as a router (172.30.<s>.0/24,
    /// fd30:0:0:<s>::/64; no L2 adjacency to the other segments).
    pub segment: u8,
}

impl NodeSpec {
    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 30, self.segment, self.index)
    }

    pub fn address6(&self) -> Ipv6Addr {
        Ipv6Addr::new(
            0xfd30,
            0,
            0,
            u16::from(self.segment),
            0,
            0,
            0,
            u16::from(self.index),
        )
    }

    /// This node on underlay segment `segment`.
    pub fn on_segment(self, segment: u8) -> Self {
        NodeSpec { segment, ..self }
    }

    pub fn pod_cidr6(&self) -> String {
        format!("fd44:0:0:{:x}::/64", self.index)
    }
}

/// How the agents learn the nodes.
pub enum Peers {
    File(PathBuf),
    /// An API server without authentication (the stub), by URL.
    Api(String),
    /// An API server as a node reaches it: a kubeconfig.
    Kubeconfig(PathBuf),
}

pub fn specs(list: &[(&str, u8, Option<&str>)]) -> Vec<NodeSpec> {
    list.iter()
        .map(|(name, index, cidr)| NodeSpec {
            name: name.to_string(),
            index: *index,
            pod_cidr: cidr.map(str::to_string),
            dual_stack: false,
            segment: 0,
        })
        .collect()
}

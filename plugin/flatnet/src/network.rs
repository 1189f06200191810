//! What the kernel layer is told of a configured network.

use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::node::NodeNetwork;

use crate::config::NetConf;

impl NetConf {
    /// What the node layer needs of this network.
    pub fn node_network(&self) -> NodeNetwork {
        NodeNetwork {
            name: self.name.clone(),
            gateway_device: self.gateway_device.clone(),
            mode: self.datapath,
            ip_masq: self.ip_masq,
            pin_root: self.pin_root.clone(),
            map_sizing: self.map_sizing.clone(),
        }
    }

    /// The network's datapath, pinned where the configuration says.
    pub fn pinned_datapath(&self) -> flatnet_datapath::Result<Datapath> {
        Datapath::for_network(&self.node_network())
    }
}

//! How a peer's pod CIDR is reached (`--routing`): straight via the peer's
//! address where the two nodes share a segment (host-gw), or in VXLAN
//! between node addresses where they do not, decided per peer.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

/// The agent's `--routing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RoutingMode {
    /// host-gw: a kernel route via the peer's address; needs every node on
    /// one L2 segment.
    Direct,
    /// Every cross-node pod packet in VXLAN between node addresses.
    Vxlan,
    /// Direct to a peer whose address is on one of this node's connected
    /// subnets, VXLAN to the rest (Calico's CrossSubnet, flannel's
    /// DirectRouting).
    #[default]
    Auto,
}

/// How the packets of one peer route cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Carrier {
    /// Routed via the peer's address on a shared segment.
    #[default]
    Direct,
    /// Encapsulated in VXLAN to the peer's address.
    Vxlan,
}

/// What decides a peer's carrier: the mode and this node's connected
/// subnets (the networks of its own addresses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    pub mode: RoutingMode,
    pub connected: Vec<IpNetwork>,
}

impl Routing {
    /// host-gw for every peer (the agent before `--routing`, and tests).
    pub fn direct() -> Self {
        Routing {
            mode: RoutingMode::Direct,
            connected: Vec::new(),
        }
    }

    /// The carrier for a peer reached at `via`.
    pub fn carrier(&self, via: IpAddr) -> Carrier {
        match self.mode {
            RoutingMode::Direct => Carrier::Direct,
            RoutingMode::Vxlan => Carrier::Vxlan,
            RoutingMode::Auto if self.on_segment(via) => Carrier::Direct,
            RoutingMode::Auto => Carrier::Vxlan,
        }
    }

    /// True when `address` is on one of this node's connected subnets (a
    /// host route, /32 or /128, connects nothing).
    fn on_segment(&self, address: IpAddr) -> bool {
        self.connected.iter().any(|subnet| {
            let host = if subnet.is_ipv4() { 32 } else { 128 };
            subnet.prefix() < host && subnet.contains(address)
        })
    }
}

/// The name of the node's VXLAN device (external mode: one for all peers
/// and both families).
pub const VXLAN_DEVICE: &str = "flatnet.vxlan";

/// What VXLAN adds to a packet: outer IPv4 (20) or IPv6 (40), UDP (8),
/// VXLAN (8) and the inner Ethernet header (14).
pub fn vxlan_overhead(underlay_v6: bool) -> u32 {
    if underlay_v6 { 70 } else { 50 }
}

/// The MAC of the VXLAN device of the node at `address`: locally
/// administered, 0e:66 and the address's last four bytes. Every node
/// derives its peers' from their addresses, so nothing is annotated: the
/// inner frames a peer sends are addressed to this device's MAC.
pub fn vtep_mac(address: IpAddr) -> [u8; 6] {
    // The datapath derives it from the same bytes (`flatnet_common::vtep_mac`).
    let (bytes, family) = match address {
        IpAddr::V4(v4) => {
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&v4.octets());
            (bytes, flatnet_common::AF_INET_VALUE)
        }
        IpAddr::V6(v6) => (v6.octets(), flatnet_common::AF_INET6_VALUE),
    };
    flatnet_common::vtep_mac(&bytes, family)
}

/// The next hop of a tunnelled route to `cidr`: its network address, on
/// the VXLAN device (onlink), with a permanent neighbour entry holding the
/// peer's `vtep_mac`, as flannel's vxlan backend routes via x.y.z.0.
pub fn vxlan_gateway(cidr: IpNetwork) -> IpAddr {
    cidr.network()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(mode: RoutingMode) -> Routing {
        Routing {
            mode,
            connected: vec![
                "192.168.1.10/24".parse().unwrap(),
                "fd00:1::10/64".parse().unwrap(),
                "10.0.0.5/32".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn auto_goes_direct_on_a_shared_segment_and_tunnels_to_the_rest() {
        let auto = routing(RoutingMode::Auto);
        for (peer, carrier) in [
            ("192.168.1.20", Carrier::Direct),
            ("192.168.2.20", Carrier::Vxlan),
            ("fd00:1::20", Carrier::Direct),
            ("fd00:2::20", Carrier::Vxlan),
            // A /32 on this node connects no segment.
            ("10.0.0.5", Carrier::Vxlan),
        ] {
            assert_eq!(auto.carrier(peer.parse().unwrap()), carrier, "{peer}");
        }
    }

    #[test]
    fn direct_and_vxlan_ignore_the_segments() {
        for peer in ["192.168.1.20", "192.168.2.20"] {
            let peer: IpAddr = peer.parse().unwrap();
            assert_eq!(routing(RoutingMode::Direct).carrier(peer), Carrier::Direct);
            assert_eq!(routing(RoutingMode::Vxlan).carrier(peer), Carrier::Vxlan);
        }
    }

    #[test]
    fn a_peer_device_mac_and_next_hop_come_from_its_address_and_cidr() {
        assert_eq!(
            vtep_mac("192.168.2.3".parse().unwrap()),
            [0x0e, 0x66, 192, 168, 2, 3]
        );
        assert_eq!(
            vtep_mac("fd00:2::7:0203".parse().unwrap()),
            [0x0e, 0x66, 0, 7, 2, 3]
        );
        assert_eq!(
            vxlan_gateway("10.244.3.0/24".parse().unwrap()),
            "10.244.3.0".parse::<IpAddr>().unwrap()
        );
        assert_eq!(vxlan_overhead(false), 50);
        assert_eq!(vxlan_overhead(true), 70);
    }
}

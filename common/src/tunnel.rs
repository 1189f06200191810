//! The VXLAN overlay as the datapath sees it: which remote pod CIDRs are
//! tunnelled (`REMOTE_F_TUNNEL`), the node's one VXLAN device (`TUNNEL`),
//! and the MAC every node's device has, derived from its address so that a
//! peer knows it from the node list alone.

/// `RemoteNode::flags`: the CIDR's node is reached through the VXLAN
/// device (its `node_address` is the tunnel's far end), not by a route on
/// the uplink. `from_pod` encapsulates for it; `from_uplink` leaves packets
/// claiming its sources to the stack (they should arrive encapsulated), and
/// `from_tunnel` takes them only from that node's address.
pub const REMOTE_F_TUNNEL: u32 = 1;

/// The node's VXLAN device, in the one-entry array `TUNNEL` (all zero: no
/// device, tunnelled CIDRs take the host stack's routes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TunnelConfig {
    /// The device's ifindex (the redirect target).
    pub ifindex: u32,
    /// The VNI every packet carries.
    pub vni: u32,
    /// The device's MAC: the inner frame's source, as the stack writes it.
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<TunnelConfig>() == 16);

/// The MAC of the VXLAN device of the node at `address` (`family` says how
/// many of its bytes are used, as in `RemoteNode`): 0e:66 (locally
/// administered, unicast) and the address's last four bytes.
pub const fn vtep_mac(address: &[u8; 16], family: u32) -> [u8; 6] {
    let at = if family == AF_INET6_VALUE { 12 } else { 0 };
    [
        0x0e,
        0x66,
        address[at],
        address[at + 1],
        address[at + 2],
        address[at + 3],
    ]
}

/// `AF_INET6` as `RemoteNode::family` holds it.
pub const AF_INET6_VALUE: u32 = 10;
/// `AF_INET` as `RemoteNode::family` holds it.
pub const AF_INET_VALUE: u32 = 2;

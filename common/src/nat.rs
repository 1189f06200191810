//! NodePort, externalIPs and load-balancer IPs for clients outside the
//! node: the ports such frontends listen on, and the translation table of
//! each flow the uplink program translated (both directions).

/// Flows translated at once (`NAT_FORWARD` and `NAT_REVERSE` entries each).
pub const MAX_NAT_FLOWS: u32 = 131072;
/// Entries of `EXTERNAL_PORTS`: one per port number.
pub const EXTERNAL_PORT_COUNT: u32 = 65536;
/// The node ports source-translated flows are given (network order on the
/// wire): above Linux's default ephemeral range (32768-60999), so that the
/// node's own connections do not take them.
pub const NAT_PORT_MIN: u16 = 61000;
pub const NAT_PORT_MAX: u16 = 65535;

/// Bits of an `EXTERNAL_PORTS` entry: a NodePort of the protocol listens on
/// this port (on the node addresses of `NODEPORT_ADDRS`), or an external
/// address (externalIP, load-balancer IP) does (its `SERVICES` entry then
/// says which). The low 16 bits are the agent's (Services), the high 16
/// the CNI plugin's (hostPorts, the same bits shifted by
/// `HOST_PORT_SHIFT`): each writer keeps the other's half.
pub mod external_port {
    /// The entry of port 0, which no frontend has: the bits of every
    /// port together, so "does anything listen for outside clients at
    /// all" is one read (`from_pod` asks the reply path only then).
    pub const ANY_PORT: u16 = 0;
    /// The agent's half of an entry.
    pub const SERVICE_BITS: u32 = 0xffff;
    /// Where the hostPort half starts.
    pub const HOST_PORT_SHIFT: u32 = 16;

    /// What listens on a port, hostPorts and Services together.
    #[inline(always)]
    pub const fn listening(entry: u32) -> u32 {
        (entry | (entry >> HOST_PORT_SHIFT)) & SERVICE_BITS
    }

    pub const NODEPORT_TCP: u32 = 1;
    pub const NODEPORT_UDP: u32 = 2;
    pub const NODEPORT_SCTP: u32 = 4;
    pub const ADDRESS_TCP: u32 = 1 << 8;
    pub const ADDRESS_UDP: u32 = 2 << 8;
    pub const ADDRESS_SCTP: u32 = 4 << 8;

    /// The NodePort bit of IP protocol `protocol` (0: none we serve).
    pub const fn nodeport_bit(protocol: u8) -> u32 {
        match protocol {
            6 => NODEPORT_TCP,
            17 => NODEPORT_UDP,
            132 => NODEPORT_SCTP,
            _ => 0,
        }
    }

    /// The external-address bit of IP protocol `protocol`.
    pub const fn address_bit(protocol: u8) -> u32 {
        nodeport_bit(protocol) << 8
    }
}

/// A flow as a packet names it (IPv4 in the first 4 bytes of each address;
/// ports in network order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct NatKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub src_port: [u8; 2],
    pub dst_port: [u8; 2],
    pub protocol: u8,
    /// 4 or 6.
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<NatKey>() == 40);

/// Fragmented datagrams of translated flows in flight at once, per family:
/// a datagram's later fragments carry no transport header, so the ports
/// its first fragment had are kept for them (`NAT_FRAGMENTS`,
/// `NAT_FRAGMENTS6`).
pub const MAX_NAT_FRAGMENTS: u32 = 8192;

/// A fragmented IPv4 datagram: its ends, IP identification and protocol,
/// as every one of its fragments carries them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragmentKey {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub id: [u8; 2],
    pub protocol: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<FragmentKey>() == 12);

/// A fragmented IPv6 datagram: its ends, and its fragment header's
/// identification and next header (the transport protocol), as every one
/// of its fragments carries them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragmentKey6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub id: [u8; 4],
    pub protocol: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<FragmentKey6>() == 40);

/// The ports a fragmented datagram's first fragment carried (network
/// order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragmentPorts {
    pub src_port: [u8; 2],
    pub dst_port: [u8; 2],
}

/// A flow from outside to a frontend: the backend it was given, and the
/// node port its source was translated to (0: the client's address kept,
/// `externalTrafficPolicy: Local`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatForward {
    pub backend: [u8; 16],
    pub backend_port: [u8; 2],
    pub nat_port: [u8; 2],
    /// `NAT_F_*`.
    pub flags: u32,
    /// When a packet of the flow last passed (monotonic ns, refreshed at
    /// most once a second; from the coarse clock, `bpf_ktime_get_coarse_ns`:
    /// the last tick's time, never ahead of `CLOCK_MONOTONIC`, and no
    /// clock-source read per packet).
    pub last_ns: u64,
}
const _: () = assert!(size_of::<NatForward>() == 32);

/// A reply of a translated flow, keyed by how the backend addresses it: it
/// leaves from the frontend to the client.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatReverse {
    pub client: [u8; 16],
    pub frontend: [u8; 16],
    pub client_port: [u8; 2],
    pub frontend_port: [u8; 2],
    /// The uplink the flow came in by: the replies' way out is looked up
    /// there.
    pub ifindex: u32,
    /// `NAT_F_*`.
    pub flags: u32,
    pub _pad: u32,
    pub last_ns: u64,
}
const _: () = assert!(size_of::<NatReverse>() == 56);

/// A TCP flow that saw a FIN or RST: collected after a short timeout.
pub const NAT_F_CLOSING: u32 = 1;
/// A TCP flow that saw a RST: its node port may be given to a new flow at
/// once.
pub const NAT_F_RESET: u32 = 2;
/// `NatForward::flags`: the flow's source became the address the kernel
/// selects toward a local backend over IPv6 (`NAT_LOCAL_SOURCES`), not
/// its frontend's, as MASQUERADE picks it: the pod network's gateway
/// address, the longest match with the pod's.
pub const NAT_F_LOCAL_SOURCE: u32 = 4;
/// A flow whose client keeps its address (`externalTrafficPolicy: Local`,
/// hostPorts), on its reverse entry: its replies go to the client as it
/// is, maybe a pod of a node the VXLAN tunnel reaches.
pub const NAT_F_CLIENT_KEPT: u32 = 8;

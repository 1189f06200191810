//! Services in eBPF: frontends, backends, reverse translation for
//! sockets, and session affinity.

use crate::*;

/// Service ports (frontends) and backends a node holds, and sockets whose
/// peer stands for a ClusterIP.
pub const MAX_SERVICES: u32 = 65536;
pub const MAX_SERVICE_BACKENDS: u32 = 262144;
pub const MAX_SERVICE_REVNAT: u32 = 65536;
pub const MAX_SERVICE_AFFINITY: u32 = 65536;
/// Node addresses NodePorts answer on (every node's, both families).
pub const MAX_NODEPORT_ADDRS: u32 = 16384;

/// Entries of `NODEPORT_PORTS`: one per port number.
pub const NODEPORT_PORT_COUNT: u32 = 65536;

/// Bits of a `NODEPORT_PORTS` entry: a NodePort of the protocol listens on
/// this port number.
pub mod nodeport_port {
    pub const TCP: u32 = 1;
    pub const UDP: u32 = 2;
    pub const SCTP: u32 = 4;

    /// The bit of IP protocol `protocol` (0: a protocol Services do not have).
    pub const fn bit(protocol: u8) -> u32 {
        match protocol {
            6 => TCP,
            17 => UDP,
            132 => SCTP,
            _ => 0,
        }
    }
}

/// A node address a NodePort answers on (IPv4 in the first 4 bytes). A
/// NodePort's frontend has the unspecified address of its family: one
/// entry per NodePort, not one per NodePort and node address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodePortAddress {
    pub address: [u8; 16],
    /// 4 or 6.
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<NodePortAddress>() == 20);

/// A client of a frontend with sessionAffinity: its network namespace
/// (a pod's, or the host's: one client IP each) and the frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AffinityKey {
    pub netns_cookie: u64,
    pub frontend: ServiceKey,
    pub _pad: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 32);

/// The backend (`index` in set `id`) a client was given, and when it last
/// connected to the frontend (monotonic ns). Worth nothing once the
/// frontend moved to another backend set.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Affinity {
    pub id: u32,
    pub index: u32,
    pub last_ns: u64,
}

/// A Service frontend: a ClusterIP (IPv4 in the first 4 bytes), a port
/// (network order) and protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceKey {
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub protocol: u8,
    /// 4 or 6.
    pub family: u8,
}
const _: () = assert!(size_of::<ServiceKey>() == 20);

/// Where a frontend's backends are: `count` of them in
/// `SERVICE_BACKENDS` under (`id`, 0..count). `count` 0: the Service has no
/// endpoint, connect() is refused. `affinity_secs`: sessionAffinity
/// ClientIP's timeout (0: none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceValue {
    pub id: u32,
    pub count: u32,
    pub affinity_secs: u32,
    pub _pad: u32,
}

/// Backend `index` of the backend set `id`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BackendKey {
    pub id: u32,
    pub index: u32,
}

/// A backend: an address (IPv4 in the first 4 bytes) and port (network
/// order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceBackend {
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub family: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<ServiceBackend>() == 20);

/// A socket (its cookie) whose peer is `address`:`port` because a
/// ClusterIP was rewritten to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RevNatKey {
    pub cookie: u64,
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub family: u8,
    pub _pad: [u8; 5],
}
const _: () = assert!(size_of::<RevNatKey>() == 32);

/// The ClusterIP and port the application asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RevNat {
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<RevNat>() == 20);

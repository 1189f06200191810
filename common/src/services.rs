//! Services in eBPF: frontends, backends, reverse translation for
//! sockets, and session affinity.

/// Service ports (frontends) and backends a node holds, and sockets whose
/// peer stands for a ClusterIP.
pub const MAX_SERVICES: u32 = 65536;
pub const MAX_SERVICE_BACKENDS: u32 = 262144;
pub const MAX_SERVICE_REVNAT: u32 = 65536;
pub const MAX_SERVICE_AFFINITY: u32 = 65536;
/// Node addresses NodePorts answer on (every node's, both families).
pub const MAX_NODEPORT_ADDRS: u32 = 16384;

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
/// ClientIP's timeout (0: none). Clients outside the node (a NodePort or
/// external address, `FRONTEND_F_EXTERNAL`) choose among the first
/// `external_count` backends: all of them, or with `externalTrafficPolicy:
/// Local` (`FRONTEND_F_KEEP_CLIENT`) those on this node, which come first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceValue {
    pub id: u32,
    pub count: u32,
    pub affinity_secs: u32,
    pub external_count: u16,
    pub flags: u16,
}

/// `ServiceValue::flags`: outside clients may reach this frontend (a
/// NodePort, an externalIP, a load-balancer IP).
pub const FRONTEND_F_EXTERNAL: u16 = 1;
/// `externalTrafficPolicy: Local`: outside clients keep their address and
/// reach only this node's backends.
pub const FRONTEND_F_KEEP_CLIENT: u16 = 2;
/// `NODEPORT_ADDRS` values: this node's own address, or another node's.
/// A NodePort with `externalTrafficPolicy: Local` on another node's
/// address is left to that node (kube-proxy does not translate it: the
/// packet goes there, and that node serves it from its own endpoints).
/// An older agent wrote 1 for every address: read as this node's.
pub const NODEPORT_ADDR_THIS_NODE: u32 = 1;
pub const NODEPORT_ADDR_OTHER_NODE: u32 = 2;
/// A Pod's `hostPort`, written by the CNI plugin at ADD (not the agent,
/// which leaves such frontends alone): one backend, the pod, reached with
/// the client's address kept, as portmap's DNAT does.
pub const FRONTEND_F_HOST_PORT: u16 = 4;
/// Backend-set ids of hostPort frontends (the CNI's); the agent's are
/// below.
pub const HOST_PORT_ID_BASE: u32 = 0x8000_0000;

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

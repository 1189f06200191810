//! Services at the socket: the frontend and backend maps the cgroup v2
//! programs (`service_programs`) and the uplink's NodePort path use.
//!
//! A frontend's backends are replaced without a moment with none: the new
//! set goes in under a fresh set id first, then the frontend is switched to
//! it in one map update, then the old set is deleted.

use std::net::{IpAddr, SocketAddr};

use flatnet_common::{
    BackendKey, FRONTEND_F_EXTERNAL, FRONTEND_F_HOST_PORT, FRONTEND_F_KEEP_CLIENT,
    MAP_NODE_SOURCES, MAP_NODEPORT_ADDRS, MAP_SERVICE_REVNAT, MAP_SERVICES, NodePortAddress,
    RevNatKey, ServiceBackend, ServiceKey, ServiceValue,
};

use flatnet_common::maps;

use super::typed::HashOf;
use super::{Datapath, ignore_missing};
use crate::error::{Error, Result};

/// Whether clients outside the node reach a frontend (a NodePort, an
/// externalIP, a load-balancer IP: the uplink program serves them), and
/// which of its backends serve them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outside {
    /// A ClusterIP: only clients at the socket (pods, the node).
    #[default]
    No,
    /// All backends; the client's source translated to the node address
    /// (`externalTrafficPolicy: Cluster`).
    Cluster,
    /// The first this many backends (this node's, listed first); the
    /// client's address kept (`externalTrafficPolicy: Local`).
    Local(u16),
}

impl Outside {
    /// `ServiceValue`'s (`external_count`, `flags`) for a frontend of
    /// `count` backends.
    fn fields(self, count: u32) -> (u16, u16) {
        match self {
            Outside::No => (0, 0),
            Outside::Cluster => (
                u16::try_from(count).unwrap_or(u16::MAX),
                FRONTEND_F_EXTERNAL,
            ),
            Outside::Local(local) => (local, FRONTEND_F_EXTERNAL | FRONTEND_F_KEEP_CLIENT),
        }
    }

    /// What a frontend's map value says.
    pub fn of(value: &ServiceValue) -> Self {
        if value.flags & FRONTEND_F_EXTERNAL == 0 {
            Outside::No
        } else if value.flags & FRONTEND_F_KEEP_CLIENT != 0 {
            Outside::Local(value.external_count)
        } else {
            Outside::Cluster
        }
    }
}

/// IPv4 in the first 4 bytes, as the maps hold addresses; and the family.
fn address_bytes(address: IpAddr) -> ([u8; 16], u8) {
    match address {
        IpAddr::V4(v4) => {
            let mut bytes = [0; 16];
            bytes[..4].copy_from_slice(&v4.octets());
            (bytes, 4)
        }
        IpAddr::V6(v6) => (v6.octets(), 6),
    }
}

/// The frontend key of `cluster_ip`:`port` over IP protocol `protocol`.
pub fn service_key(cluster_ip: IpAddr, port: u16, protocol: u8) -> ServiceKey {
    let (address, family) = address_bytes(cluster_ip);
    ServiceKey {
        address,
        port: port.to_be_bytes(),
        protocol,
        family,
    }
}

/// The map value of a backend.
pub fn service_backend(backend: SocketAddr) -> ServiceBackend {
    let (address, family) = address_bytes(backend.ip());
    ServiceBackend {
        address,
        port: backend.port().to_be_bytes(),
        family,
        _pad: 0,
    }
}

pub(super) fn address_of(bytes: &[u8; 16], family: u8) -> IpAddr {
    if family == 4 {
        IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])
    } else {
        IpAddr::from(*bytes)
    }
}

/// (ClusterIP, port, protocol) of a frontend key.
pub fn frontend_of(key: &ServiceKey) -> (IpAddr, u16, u8) {
    (
        address_of(&key.address, key.family),
        u16::from_be_bytes(key.port),
        key.protocol,
    )
}

/// The address of a backend entry.
pub fn backend_address(backend: &ServiceBackend) -> SocketAddr {
    SocketAddr::new(
        address_of(&backend.address, backend.family),
        u16::from_be_bytes(backend.port),
    )
}

impl Datapath {
    /// Every frontend in `SERVICES` (none when the maps are not pinned).
    pub fn service_frontends(&self) -> Result<Vec<(ServiceKey, ServiceValue)>> {
        if !self.map_path(MAP_SERVICES).exists() {
            return Ok(Vec::new());
        }
        let map = self.hash_map::<maps::SERVICES>()?;
        map.iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::bpf("reading SERVICES", e))
    }

    /// The backends of `key`'s frontend, in index order; None without one.
    pub fn service_backends(&self, key: &ServiceKey) -> Result<Option<Vec<ServiceBackend>>> {
        let frontends = self.hash_map::<maps::SERVICES>()?;
        let Ok(value) = frontends.get(key, 0) else {
            return Ok(None);
        };
        let backends = self.hash_map::<maps::SERVICE_BACKENDS>()?;
        (0..value.count)
            .map(|index| {
                backends
                    .get(
                        &BackendKey {
                            id: value.id,
                            index,
                        },
                        0,
                    )
                    .map_err(|e| Error::bpf("reading SERVICE_BACKENDS", e))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Points `key`'s frontend at `backends`, written first under set `id`
    /// (one no other frontend uses, and not the frontend's current one);
    /// then the set the frontend had is deleted. No backends: connect() to
    /// it is refused. `outside`: who outside the node reaches it.
    pub fn put_service(
        &self,
        key: &ServiceKey,
        id: u32,
        backends: &[ServiceBackend],
        affinity_secs: u32,
        outside: Outside,
    ) -> Result<()> {
        let count = u32::try_from(backends.len())
            .map_err(|_| Error::Datapath("too many backends".into()))?;
        let (external_count, flags) = outside.fields(count);
        let value = ServiceValue {
            id,
            count,
            affinity_secs,
            external_count,
            flags,
        };
        self.put_frontend(key, backends, value)
    }

    /// `put_service` with the frontend's value given. A Service and a
    /// Pod's hostPort on the same frontend: the one there stays (they have
    /// different owners, the agent and the CNI plugin, who would otherwise
    /// take turns).
    pub(super) fn put_frontend(
        &self,
        key: &ServiceKey,
        backends: &[ServiceBackend],
        value: ServiceValue,
    ) -> Result<()> {
        let mut frontends = self.hash_map::<maps::SERVICES>()?;
        let previous = frontends.get(key, 0).ok();
        if let Some(previous) = previous
            && (previous.flags ^ value.flags) & FRONTEND_F_HOST_PORT != 0
        {
            let (address, port, protocol) = frontend_of(key);
            let (there, refused) = if previous.flags & FRONTEND_F_HOST_PORT != 0 {
                ("a Pod's hostPort", "a Service's")
            } else {
                ("a Service's", "a Pod's hostPort")
            };
            return Err(Error::Config(format!(
                "port {port} ({}) on {address} is {there} on this node; {refused} frontend there is refused: give one of them another port",
                protocol_name(protocol)
            )));
        }
        let mut sets = self.hash_map::<maps::SERVICE_BACKENDS>()?;
        for (index, backend) in backends.iter().enumerate() {
            let index =
                u32::try_from(index).map_err(|_| Error::Datapath("too many backends".into()))?;
            sets.insert(
                BackendKey {
                    id: value.id,
                    index,
                },
                backend,
                0,
            )
            .map_err(|e| Error::bpf("writing SERVICE_BACKENDS", e))?;
        }
        frontends
            .insert(key, value, 0)
            .map_err(|e| Error::bpf("writing SERVICES", e))?;
        if let Some(previous) = previous.filter(|p| p.id != value.id) {
            delete_set(&mut sets, previous)?;
        }
        Ok(())
    }

    /// Removes `key`'s frontend, then its backends.
    pub fn delete_service(&self, key: &ServiceKey) -> Result<()> {
        let mut frontends = self.hash_map::<maps::SERVICES>()?;
        let Ok(previous) = frontends.get(key, 0) else {
            return Ok(());
        };
        ignore_missing(frontends.remove(key))?;
        let mut sets = self.hash_map::<maps::SERVICE_BACKENDS>()?;
        delete_set(&mut sets, previous)
    }

    /// The node addresses NodePorts answer on (none when the maps are not
    /// pinned).
    pub fn nodeport_addresses(&self) -> Result<Vec<IpAddr>> {
        if !self.map_path(MAP_NODEPORT_ADDRS).exists() {
            return Ok(Vec::new());
        }
        let map = self.hash_map::<maps::NODEPORT_ADDRS>()?;
        map.keys()
            .map(|key| key.map(|key| address_of(&key.address, key.family)))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::bpf(format!("reading {MAP_NODEPORT_ADDRS}"), e))
    }

    /// The node's own source address per family (`NODE_SOURCES`): the first
    /// of `addresses` (its InternalIPs, preferred first) of each; none for a
    /// family it has no address of.
    pub fn set_node_sources(&self, addresses: &[IpAddr]) -> Result<()> {
        let mut map = self.array::<maps::NODE_SOURCES>()?;
        for (index, ipv4) in [(0, true), (1, false)] {
            let source = addresses
                .iter()
                .find(|address| address.is_ipv4() == ipv4)
                .map_or([0; 16], |address| address_bytes(*address).0);
            map.set(index, source, 0)
                .map_err(|e| Error::bpf(format!("writing {MAP_NODE_SOURCES}"), e))?;
        }
        Ok(())
    }

    /// The node's own source address of each family, as `set_node_sources`
    /// wrote them.
    pub fn node_sources(&self) -> Result<Vec<IpAddr>> {
        let map = self.array::<maps::NODE_SOURCES>()?;
        let mut sources = Vec::new();
        for (index, family) in [(0, 4), (1, 6)] {
            let source = map
                .get(&index, 0)
                .map_err(|e| Error::bpf(format!("reading {MAP_NODE_SOURCES}"), e))?;
            if source != [0; 16] {
                sources.push(address_of(&source, family));
            }
        }
        Ok(sources)
    }

    /// Makes NodePorts answer on `address` too, as this node's own
    /// (`Some(true)`) or another node's (`Some(false)`: an
    /// `externalTrafficPolicy: Local` NodePort there is left to that node),
    /// or no longer (`None`).
    pub fn set_nodeport_address(&self, address: IpAddr, this_node: Option<bool>) -> Result<()> {
        let mut map = self.hash_map::<maps::NODEPORT_ADDRS>()?;
        let (bytes, family) = address_bytes(address);
        let key = NodePortAddress {
            address: bytes,
            family,
            _pad: [0; 3],
        };
        let owner = match this_node {
            Some(true) => flatnet_common::NODEPORT_ADDR_THIS_NODE,
            Some(false) => flatnet_common::NODEPORT_ADDR_OTHER_NODE,
            None => return ignore_missing(map.remove(&key)),
        };
        map.insert(key, owner, 0)
            .map_err(|e| Error::bpf(format!("writing {MAP_NODEPORT_ADDRS}"), e))
    }

    fn revnat(&self) -> Result<HashOf<maps::SERVICE_REVNAT>> {
        self.hash_map::<maps::SERVICE_REVNAT>()
    }

    /// The frontend a socket (its cookie) asked for when connect() or
    /// sendmsg() sent it to `backend` instead; None for a socket that went
    /// to `backend` by its own address (or whose record the LRU dropped).
    pub fn socket_frontend(&self, cookie: u64, backend: SocketAddr) -> Result<Option<SocketAddr>> {
        let key = revnat_key(cookie, backend);
        match self.revnat()?.get(&key, 0) {
            Ok(original) => Ok(Some(SocketAddr::new(
                address_of(&original.address, key.family),
                u16::from_be_bytes(original.port),
            ))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(Error::bpf(format!("reading {MAP_SERVICE_REVNAT}"), e)),
        }
    }

    /// Forgets what `socket_frontend` answers for (`cookie`, `backend`):
    /// the socket was destroyed.
    pub fn forget_socket(&self, cookie: u64, backend: SocketAddr) -> Result<()> {
        ignore_missing(self.revnat()?.remove(&revnat_key(cookie, backend)))
    }
}

fn revnat_key(cookie: u64, backend: SocketAddr) -> RevNatKey {
    let (address, family) = address_bytes(backend.ip());
    RevNatKey {
        cookie,
        address,
        port: backend.port().to_be_bytes(),
        family,
        _pad: [0; 5],
    }
}

/// An IP protocol number as Kubernetes names it.
pub fn protocol_name(protocol: u8) -> &'static str {
    match protocol {
        6 => "TCP",
        17 => "UDP",
        132 => "SCTP",
        _ => "other",
    }
}

/// Deletes the entries of the backend set `value` points at.
fn delete_set(sets: &mut HashOf<maps::SERVICE_BACKENDS>, value: ServiceValue) -> Result<()> {
    for index in 0..value.count {
        ignore_missing(sets.remove(&BackendKey {
            id: value.id,
            index,
        }))?;
    }
    Ok(())
}

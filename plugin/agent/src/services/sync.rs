//! Services in eBPF (`--services ebpf`): the node's frontends and backends
//! kept in the datapath's Service maps, from the watched Services and
//! EndpointSlices.
//!
//! Plan, then apply: `desired` is the pure state the maps should hold,
//! `steps` the difference from what this agent wrote (or found at start:
//! a restarted agent adopts the maps as they are, so a restart rewrites
//! nothing and no connection notices it). Only frontends whose backends or
//! affinity changed are rewritten, each under a fresh backend-set id, so a
//! Service never has a moment without backends (see the datapath's
//! `put_service`).
//!
//! A backend that leaves a frontend takes its clients' sockets with it: the
//! TCP connections and connected UDP sockets that the socket programs sent
//! to it for that frontend (`SERVICE_REVNAT` knows which) are destroyed in
//! every network namespace, so their next call fails and the client
//! connects again, to a live backend. A socket that named the backend pod's
//! address itself is left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use flatnet_common::{FRONTEND_F_HOST_PORT, HOST_PORT_ID_BASE, external_port};
use flatnet_datapath::bpf::{Datapath, Outside, service_backend, service_key};
use flatnet_datapath::sockets::{self, Connected};

use crate::metrics::AgentMetrics;
use crate::services::Frontend;
use crate::services::ports::{self, Change, external_ports};

/// A frontend: ClusterIP, port and IP protocol number.
pub type FrontendKey = (IpAddr, u16, u8);

/// What a frontend leads to: its backends (in map order),
/// sessionAffinity ClientIP's timeout in seconds (0: none), and who
/// outside the node reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub backends: Vec<SocketAddr>,
    pub affinity_secs: u32,
    pub outside: Outside,
}

/// The state the maps should hold for `frontends`: each ClusterIP's and
/// external IP's port, and each NodePort as the unspecified address of
/// each family `node_addresses` has (the datapath's wildcard for "any node
/// address", see `NODEPORT_ADDRS`), with the backends of its family (none:
/// connect() refused). Clients at the socket are all inside the cluster
/// (this node's pods and the node itself), so every address leads to the
/// Service's cluster-wide backends, as kube-proxy sends in-cluster traffic
/// to an external address (`externalTrafficPolicy` is about traffic from
/// outside). Clients outside the node reach NodePorts and external
/// addresses through the uplink program: with `externalTrafficPolicy:
/// Local` only this node's backends, listed first.
pub fn desired(
    frontends: &[Frontend<'_>],
    node_addresses: &[IpAddr],
) -> BTreeMap<FrontendKey, Target> {
    let wildcards: BTreeSet<IpAddr> = node_addresses
        .iter()
        .map(|ip| match ip {
            IpAddr::V4(_) => IpAddr::from(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::from(Ipv6Addr::UNSPECIFIED),
        })
        .collect();
    let mut out = BTreeMap::new();
    for frontend in frontends {
        let affinity_secs = frontend
            .affinity
            .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        for port in &frontend.ports {
            let cluster_ips = frontend
                .cluster_ips
                .iter()
                .map(|ip| (*ip, port.port, false));
            let external_ips = frontend
                .external_ips
                .iter()
                .map(|ip| (*ip, port.port, true));
            let node_ports = port
                .node_port
                .into_iter()
                .flat_map(|node_port| wildcards.iter().map(move |ip| (*ip, node_port, true)));
            for (ip, listening, reached) in cluster_ips.chain(external_ips).chain(node_ports) {
                let mut backends: Vec<SocketAddr> = port
                    .backends_for(ip)
                    .map(|(address, target)| SocketAddr::new(*address, *target))
                    .collect();
                let outside = match (reached, frontend.external_local) {
                    (false, _) => Outside::No,
                    (true, false) => Outside::Cluster,
                    (true, true) => {
                        let here =
                            |b: &SocketAddr| port.local_backends.contains(&(b.ip(), b.port()));
                        backends.sort_by_key(|b| !here(b));
                        let local = backends.iter().filter(|b| here(b)).count();
                        Outside::Local(u16::try_from(local).unwrap_or(u16::MAX))
                    }
                };
                out.insert(
                    (ip, listening, port.protocol.number()),
                    Target {
                        backends,
                        affinity_secs,
                        outside,
                    },
                );
            }
        }
    }
    out
}

/// One change to the maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<'a> {
    Put(FrontendKey, &'a Target),
    Delete(FrontendKey),
}

/// What turns `written` into `desired`: gone frontends deleted, new and
/// changed ones put; unchanged ones untouched.
pub fn steps<'a>(
    written: &BTreeMap<FrontendKey, Target>,
    desired: &'a BTreeMap<FrontendKey, Target>,
) -> Vec<Step<'a>> {
    let gone = written
        .keys()
        .filter(|key| !desired.contains_key(key))
        .map(|key| Step::Delete(*key));
    let changed = desired
        .iter()
        .filter(|(key, target)| written.get(key) != Some(target))
        .map(|(key, target)| Step::Put(*key, target));
    gone.chain(changed).collect()
}

/// (frontend, backend) pairs of `written` that `desired` no longer has:
/// the backend left the frontend, or the frontend is gone.
pub fn departed(
    written: &BTreeMap<FrontendKey, Target>,
    desired: &BTreeMap<FrontendKey, Target>,
) -> BTreeSet<(FrontendKey, SocketAddr)> {
    // Unchanged frontends (most, at every update) are skipped whole; a
    // changed one is compared as a set, not backend by backend.
    written
        .iter()
        .filter(|(key, target)| desired.get(key) != Some(*target))
        .flat_map(|(key, target)| {
            let staying: BTreeSet<&SocketAddr> = desired
                .get(key)
                .map(|t| t.backends.iter().collect())
                .unwrap_or_default();
            target
                .backends
                .iter()
                .filter(move |backend| !staying.contains(backend))
                .map(move |backend| (*key, *backend))
        })
        .collect()
}

/// The Service maps of this node and what this agent knows is in them.
pub struct ServiceSync {
    datapath: Datapath,
    metrics: AgentMetrics,
    written: BTreeMap<FrontendKey, Target>,
    /// What `NODEPORT_ADDRS` holds: each address, and whether it was
    /// written as this node's (None: adopted, not known).
    node_addresses: BTreeMap<IpAddr, Option<bool>>,
    /// The `healthCheckNodePort` servers.
    pub health: crate::services::health::HealthServers,
    /// What `EXTERNAL_PORTS` holds (ports with no bit left out).
    external_ports: BTreeMap<u16, u32>,
    /// The bits the frontends want, as of the last update; and the ports
    /// held beyond them for live flows (`ports::hold_for_live_flows`).
    wanted_ports: BTreeMap<u16, u32>,
    held_ports: BTreeSet<u16>,
    /// The next backend-set id: above every id in the maps at start.
    next_id: u32,
}

impl ServiceSync {
    /// Adopts what the maps hold (a restarted agent's predecessor wrote it).
    pub fn start(datapath: Datapath, metrics: AgentMetrics) -> flatnet_datapath::Result<Self> {
        let mut written = BTreeMap::new();
        let mut next_id = 1;
        // Pods' hostPorts are the CNI plugin's: neither adopted nor counted.
        let services = datapath
            .service_frontends()?
            .into_iter()
            .filter(|(_, value)| value.flags & FRONTEND_F_HOST_PORT == 0);
        for (key, value) in services {
            next_id = next_id.max(value.id.wrapping_add(1));
            let backends = datapath
                .service_backends(&key)?
                .unwrap_or_default()
                .iter()
                .map(flatnet_datapath::bpf::backend_address)
                .collect();
            written.insert(
                flatnet_datapath::bpf::frontend_of(&key),
                Target {
                    backends,
                    affinity_secs: value.affinity_secs,
                    outside: Outside::of(&value),
                },
            );
        }
        let node_addresses = datapath
            .nodeport_addresses()?
            .into_iter()
            .map(|address| (address, None))
            .collect();
        let external_ports: BTreeMap<u16, u32> = datapath
            .external_port_bits()?
            .into_iter()
            .map(|(port, bits)| (port, bits & external_port::SERVICE_BITS))
            .filter(|(_, bits)| *bits != 0)
            .collect();
        tracing::info!(frontends = written.len(), "Service maps adopted");
        Ok(ServiceSync {
            datapath,
            metrics,
            written,
            node_addresses,
            health: Default::default(),
            wanted_ports: external_ports.clone(),
            external_ports,
            held_ports: BTreeSet::new(),
            next_id,
        })
    }

    /// Makes the maps hold `desired`, NodePorts answering on
    /// `node_addresses` (those in `own` this node's); a failed step is
    /// logged, counted and tried again at the next update.
    pub fn update(
        &mut self,
        desired: &BTreeMap<FrontendKey, Target>,
        node_addresses: &[IpAddr],
        own: &[IpAddr],
    ) {
        let start = Instant::now();
        self.update_node_addresses(node_addresses, own);
        // A port's bits gained before the frontends on it are put, lost
        // after they are deleted: a bit without its frontend only costs a
        // call or packet a lookup, a frontend without its bit would not
        // answer.
        let ports = external_ports(desired);
        self.write_ports(&ports, Change::Gained);
        let departed = departed(&self.written, desired);
        for step in steps(&self.written, desired) {
            let outcome = match step {
                Step::Delete(key) => self
                    .datapath
                    .delete_service(&service_key(key.0, key.1, key.2))
                    .map(|()| {
                        self.written.remove(&key);
                    }),
                Step::Put(key, target) => {
                    let id = self.next_id;
                    // Below the hostPorts' ids.
                    self.next_id = ((self.next_id + 1) % HOST_PORT_ID_BASE).max(1);
                    let backends: Vec<_> = target
                        .backends
                        .iter()
                        .copied()
                        .map(service_backend)
                        .collect();
                    self.datapath
                        .put_service(
                            &service_key(key.0, key.1, key.2),
                            id,
                            &backends,
                            target.affinity_secs,
                            target.outside,
                        )
                        .map(|()| {
                            self.written.insert(key, target.clone());
                        })
                }
            };
            if let Err(e) = outcome {
                self.metrics.service_errors.inc();
                tracing::warn!(error = %e, ?step, "cannot write a Service frontend");
            }
        }
        self.metrics
            .service_update
            .0
            .observe(start.elapsed().as_secs_f64());
        self.metrics.services.set(self.written.len() as i64);
        self.metrics
            .service_backends
            .set(self.written.values().map(|t| t.backends.len() as i64).sum());
        self.wanted_ports = ports;
        self.release_ports();
        self.close_departed(&departed);
        crate::services::nat::forget_departed(&self.datapath, &self.metrics, &departed);
    }

    /// Takes away the bits no frontend wants, but those live TCP flows
    /// from outside still use (after each update, and at each resync
    /// while some are held).
    pub fn release_ports(&mut self) {
        let mut wanted = self.wanted_ports.clone();
        let held = ports::hold_for_live_flows(&self.datapath, &self.external_ports, &mut wanted);
        if held != self.held_ports {
            tracing::info!(?held, "ports held for established flows from outside");
        }
        self.held_ports = held;
        self.write_ports(&wanted, Change::Lost);
    }

    /// Whether some ports are held for live flows.
    pub fn holds_ports(&self) -> bool {
        !self.held_ports.is_empty()
    }

    fn write_ports(&mut self, wanted: &BTreeMap<u16, u32>, change: Change) {
        ports::update(
            &self.datapath,
            &self.metrics,
            &mut self.external_ports,
            wanted,
            change,
        );
    }

    /// New node addresses first: a NodePort frontend put after them is
    /// served on all of them at once.
    fn update_node_addresses(&mut self, node_addresses: &[IpAddr], own: &[IpAddr]) {
        let wanted: BTreeMap<IpAddr, Option<bool>> = node_addresses
            .iter()
            .map(|ip| (*ip, Some(own.contains(ip))))
            .collect();
        // New or changed owner first, gone after.
        let put = wanted
            .iter()
            .filter(|(ip, mine)| self.node_addresses.get(*ip) != Some(*mine))
            .map(|(ip, mine)| (*ip, *mine));
        let gone = self
            .node_addresses
            .keys()
            .filter(|ip| !wanted.contains_key(*ip))
            .map(|ip| (*ip, None));
        let changes: Vec<(IpAddr, Option<bool>)> = put.chain(gone).collect();
        for (address, mine) in changes {
            match self.datapath.set_nodeport_address(address, mine) {
                Ok(()) if mine.is_some() => {
                    self.node_addresses.insert(address, mine);
                }
                Ok(()) => {
                    self.node_addresses.remove(&address);
                }
                Err(e) => {
                    self.metrics.service_errors.inc();
                    tracing::warn!(error = %e, %address, "cannot write a NodePort address");
                }
            }
        }
    }

    /// Destroys the local clients' sockets that the socket programs sent
    /// to a backend in `departed` for its frontend there.
    fn close_departed(&self, departed: &BTreeSet<(FrontendKey, SocketAddr)>) {
        if departed.is_empty() {
            return;
        }
        let peers: BTreeSet<(u8, SocketAddr)> = departed
            .iter()
            .map(|((_, _, protocol), backend)| (*protocol, *backend))
            .collect();
        let datapath = &self.datapath;
        let condemn =
            |socket: &Connected| match datapath.socket_frontend(socket.cookie, socket.peer) {
                Ok(Some(frontend)) => departed.contains(&(
                    (frontend.ip(), frontend.port(), socket.protocol),
                    socket.peer,
                )),
                _ => false,
            };
        let searching = Instant::now();
        let outcome = sockets::destroy_connected(&peers, &condemn);
        tracing::info!(
            departed = departed.len(),
            namespaces = outcome.namespaces_searched,
            destroyed = outcome.sockets.len(),
            elapsed_ms = searching.elapsed().as_secs_f64() * 1e3,
            "searched for sockets to backends that left"
        );
        for socket in &outcome.sockets {
            // The LRU would age it out; a destroyed socket needs no record.
            let _ = datapath.forget_socket(socket.cookie, socket.peer);
            tracing::info!(
                protocol = socket.protocol,
                local = %socket.local,
                backend = %socket.peer,
                "destroyed a socket whose Service backend left"
            );
        }
        self.metrics
            .service_sockets_destroyed
            .inc_by(outcome.sockets.len() as u64);
        for failure in &outcome.failures {
            tracing::warn!(error = %failure, "cannot search a network namespace for sockets to destroy");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flatnet_common::external_port;

    use super::*;
    use crate::protocol::Protocol;
    use crate::services::FrontendPort;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn frontend(backends: &[(&str, u16)], affinity: Option<u64>) -> Frontend<'static> {
        Frontend {
            namespace: "ns",
            name: "web",
            cluster_ips: vec![ip("10.96.0.10"), ip("fd96::a")],
            external_ips: Vec::new(),
            affinity: affinity.map(Duration::from_secs),
            external_local: false,
            health_check_node_port: None,
            local_ready_endpoints: 0,
            ports: vec![FrontendPort {
                name: String::new(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: None,
                backends: backends.iter().map(|(a, p)| (ip(a), *p)).collect(),
                local_backends: Vec::new(),
            }],
        }
    }

    fn cluster_ips_only(frontends: &[Frontend<'_>]) -> BTreeMap<FrontendKey, Target> {
        desired(frontends, &[])
    }

    #[test]
    fn node_ports_external_and_load_balancer_ips_lead_to_the_same_backends() {
        let mut web = frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], None);
        web.external_ips = vec![ip("198.51.100.7"), ip("2001:db8::7")];
        web.ports[0].node_port = Some(30080);
        let nodes = [ip("172.30.0.1"), ip("172.30.0.2"), ip("fd30::1")];
        let state = desired(&[web], &nodes);
        // One NodePort entry per family, whatever the number of nodes.
        let v4 = vec!["10.0.0.1:8080".parse::<SocketAddr>().unwrap()];
        let v6 = vec!["[fd00::1]:8080".parse::<SocketAddr>().unwrap()];
        for (address, port, backends) in [
            ("10.96.0.10", 80, &v4),
            ("198.51.100.7", 80, &v4),
            ("0.0.0.0", 30080, &v4),
            ("fd96::a", 80, &v6),
            ("2001:db8::7", 80, &v6),
            ("::", 30080, &v6),
        ] {
            assert_eq!(
                &state[&(ip(address), port, 6)].backends,
                backends,
                "{address}"
            );
        }
        assert_eq!(state.len(), 6);
        // No node address of a family: no NodePort entry of it.
        let mut v4_only = frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], None);
        v4_only.ports[0].node_port = Some(30080);
        let v4_nodes = desired(&[v4_only], &[ip("172.30.0.1")]);
        assert!(v4_nodes.contains_key(&(ip("0.0.0.0"), 30080, 6)));
        assert!(!v4_nodes.contains_key(&(ip("::"), 30080, 6)));
    }

    #[test]
    fn external_ports_mark_each_protocol_of_each_node_port_and_external_address() {
        let mut tcp = frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], None);
        tcp.ports[0].node_port = Some(30080);
        tcp.external_ips = vec![ip("198.51.100.7")];
        let mut udp = tcp.clone();
        udp.ports[0].protocol = Protocol::Udp;
        udp.external_ips.clear();
        let mut other = frontend(&[("10.0.0.2", 53)], None);
        other.ports[0].node_port = Some(30053);
        other.ports[0].protocol = Protocol::Udp;
        let nodes = [ip("172.30.0.1"), ip("fd30::1")];
        let ports = external_ports(&desired(&[tcp, udp, other], &nodes));
        assert_eq!(
            ports,
            BTreeMap::from([
                (
                    external_port::ANY_PORT,
                    external_port::ADDRESS_TCP
                        | external_port::NODEPORT_TCP
                        | external_port::NODEPORT_UDP
                ),
                (80, external_port::ADDRESS_TCP),
                (30053, external_port::NODEPORT_UDP),
                (
                    30080,
                    external_port::NODEPORT_TCP | external_port::NODEPORT_UDP
                )
            ])
        );
        // ClusterIP ports (80 here) alone are no outside client's.
        let cluster_only = frontend(&[("10.0.0.1", 8080)], None);
        assert!(external_ports(&desired(&[cluster_only], &nodes)).is_empty());
    }

    #[test]
    fn external_traffic_policy_local_lists_this_nodes_backends_first() {
        let mut web = frontend(&[("10.0.0.1", 8080), ("10.0.0.2", 8080)], None);
        web.ports[0].node_port = Some(30080);
        web.external_local = true;
        web.ports[0].local_backends = vec![(ip("10.0.0.2"), 8080)];
        let state = desired(&[web.clone()], &[ip("172.30.0.1")]);
        let node_port = &state[&(ip("0.0.0.0"), 30080, 6)];
        assert_eq!(
            node_port.backends,
            vec![
                "10.0.0.2:8080".parse::<SocketAddr>().unwrap(),
                "10.0.0.1:8080".parse().unwrap()
            ]
        );
        assert_eq!(node_port.outside, Outside::Local(1));
        // The ClusterIP keeps its order and is no outside client's.
        assert_eq!(state[&(ip("10.96.0.10"), 80, 6)].outside, Outside::No);
        web.external_local = false;
        let state = desired(&[web], &[ip("172.30.0.1")]);
        assert_eq!(state[&(ip("0.0.0.0"), 30080, 6)].outside, Outside::Cluster);
    }

    #[test]
    fn each_cluster_ip_gets_the_backends_of_its_family() {
        let state =
            cluster_ips_only(&[frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], Some(60))]);
        assert_eq!(
            state[&(ip("10.96.0.10"), 80, 6)],
            Target {
                backends: vec!["10.0.0.1:8080".parse().unwrap()],
                affinity_secs: 60,
                outside: Outside::No,
            }
        );
        assert_eq!(
            state[&(ip("fd96::a"), 80, 6)].backends,
            vec!["[fd00::1]:8080".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn backends_that_leave_or_lose_their_frontend_have_departed() {
        let both = cluster_ips_only(&[frontend(&[("10.0.0.1", 53), ("10.0.0.2", 53)], None)]);
        let one = cluster_ips_only(&[frontend(&[("10.0.0.2", 53)], None)]);
        let backend = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            departed(&both, &one),
            BTreeSet::from([((ip("10.96.0.10"), 80, 6), backend("10.0.0.1:53"))])
        );
        // Joining is no departure; nothing changed, nothing departed.
        assert!(departed(&one, &both).is_empty());
        assert!(departed(&both, &both).is_empty());
        // The Service deleted: every backend departed from it.
        assert_eq!(departed(&both, &BTreeMap::new()).len(), 2);
    }

    #[test]
    fn only_changed_frontends_are_written() {
        let before = cluster_ips_only(&[frontend(&[("10.0.0.1", 8080)], None)]);
        // Nothing changed: nothing to do (an agent restart).
        assert!(steps(&before, &before).is_empty());
        // One backend more: only the IPv4 frontend is put again.
        let after = cluster_ips_only(&[frontend(&[("10.0.0.1", 8080), ("10.0.0.2", 8080)], None)]);
        let planned = steps(&before, &after);
        assert_eq!(planned.len(), 1);
        assert!(matches!(planned[0], Step::Put((a, 80, 6), _) if a == ip("10.96.0.10")));
        // The Service gone: both frontends deleted.
        let nothing = BTreeMap::new();
        let planned = steps(&after, &nothing);
        assert_eq!(
            planned,
            vec![
                Step::Delete((ip("10.96.0.10"), 80, 6)),
                Step::Delete((ip("fd96::a"), 80, 6))
            ]
        );
    }
}

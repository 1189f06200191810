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
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use flatnet_datapath::bpf::{Datapath, service_backend, service_key};
use flatnet_datapath::sockets::{self, Connected};

use crate::metrics::AgentMetrics;
use crate::services::Frontend;

/// A frontend: ClusterIP, port and IP protocol number.
pub type FrontendKey = (IpAddr, u16, u8);

/// What a frontend leads to: its backends (in map order) and
/// sessionAffinity ClientIP's timeout in seconds (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub backends: Vec<SocketAddr>,
    pub affinity_secs: u32,
}

/// The state the maps should hold for `frontends`: each ClusterIP's port
/// with the backends of its family (none: connect() refused).
pub fn desired(frontends: &[Frontend<'_>]) -> BTreeMap<FrontendKey, Target> {
    let mut out = BTreeMap::new();
    for frontend in frontends {
        let affinity_secs = frontend
            .affinity
            .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        for port in &frontend.ports {
            for ip in &frontend.cluster_ips {
                let backends = port
                    .backends_for(*ip)
                    .map(|(address, target)| SocketAddr::new(*address, *target))
                    .collect();
                out.insert(
                    (*ip, port.port, port.protocol.number()),
                    Target {
                        backends,
                        affinity_secs,
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
    written
        .iter()
        .flat_map(|(key, target)| {
            let staying = desired.get(key).map_or(&[][..], |t| t.backends.as_slice());
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
    /// The next backend-set id: above every id in the maps at start.
    next_id: u32,
}

impl ServiceSync {
    /// Adopts what the maps hold (a restarted agent's predecessor wrote it).
    pub fn start(datapath: Datapath, metrics: AgentMetrics) -> flatnet_datapath::Result<Self> {
        let mut written = BTreeMap::new();
        let mut next_id = 1;
        for (key, value) in datapath.service_frontends()? {
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
                },
            );
        }
        tracing::info!(frontends = written.len(), "Service maps adopted");
        Ok(ServiceSync {
            datapath,
            metrics,
            written,
            next_id,
        })
    }

    /// Makes the maps hold `desired`; a failed step is logged, counted and
    /// tried again at the next update.
    pub fn update(&mut self, desired: &BTreeMap<FrontendKey, Target>) {
        let start = Instant::now();
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
                    self.next_id = self.next_id.wrapping_add(1).max(1);
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
        self.close_departed(&departed);
    }

    /// Destroys the local clients' sockets that the socket programs sent
    /// to a backend in `departed` for its frontend there.
    fn close_departed(&self, departed: &BTreeSet<(FrontendKey, SocketAddr)>) {
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
        let outcome = sockets::destroy_connected(&peers, &condemn);
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

    use super::*;
    use crate::policy::Protocol;
    use crate::services::FrontendPort;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn frontend(backends: &[(&str, u16)], affinity: Option<u64>) -> Frontend<'static> {
        Frontend {
            namespace: "ns",
            name: "web",
            cluster_ips: vec![ip("10.96.0.10"), ip("fd96::a")],
            affinity: affinity.map(Duration::from_secs),
            ports: vec![FrontendPort {
                name: String::new(),
                protocol: Protocol::Tcp,
                port: 80,
                backends: backends.iter().map(|(a, p)| (ip(a), *p)).collect(),
            }],
        }
    }

    #[test]
    fn each_cluster_ip_gets_the_backends_of_its_family() {
        let state = desired(&[frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], Some(60))]);
        assert_eq!(
            state[&(ip("10.96.0.10"), 80, 6)],
            Target {
                backends: vec!["10.0.0.1:8080".parse().unwrap()],
                affinity_secs: 60
            }
        );
        assert_eq!(
            state[&(ip("fd96::a"), 80, 6)].backends,
            vec!["[fd00::1]:8080".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn backends_that_leave_or_lose_their_frontend_have_departed() {
        let both = desired(&[frontend(&[("10.0.0.1", 53), ("10.0.0.2", 53)], None)]);
        let one = desired(&[frontend(&[("10.0.0.2", 53)], None)]);
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
        let before = desired(&[frontend(&[("10.0.0.1", 8080)], None)]);
        // Nothing changed: nothing to do (an agent restart).
        assert!(steps(&before, &before).is_empty());
        // One backend more: only the IPv4 frontend is put again.
        let after = desired(&[frontend(&[("10.0.0.1", 8080), ("10.0.0.2", 8080)], None)]);
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

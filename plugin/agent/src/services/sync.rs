//! Services in eBPF (`--services ebpf`): the node's frontends and backends
//! kept in the datapath's Service maps, from the watched Services and
//! EndpointSlices.
//!
//! Plan (`plan.rs`), then apply: `desired` is the pure state the maps should hold,
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
//! address itself is left alone. That search runs beside the agent's loop
//! (`departures`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use flatnet_common::{FRONTEND_F_HOST_PORT, HOST_PORT_ID_BASE, external_port};
use flatnet_datapath::bpf::{Datapath, Outside, service_backend, service_key};

use crate::metrics::AgentMetrics;
use crate::services::departures::Departures;
use crate::services::plan::{FrontendKey, Scope, Step, Target, departed, steps};
use crate::services::ports::{self, Change, external_ports};

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
    /// Where backends that left go: their sockets and flows are dealt
    /// with beside the loop.
    departures: Departures,
    /// A step of the last update failed: the next pass must update even
    /// if no Service changed (the failed step is tried again there).
    unsettled: bool,
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
        let departures = Departures::start(datapath.clone(), metrics.clone());
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
            departures,
            unsettled: false,
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
        let ports = external_ports(desired);
        self.apply(desired, Scope::All, ports, node_addresses, own);
    }

    /// `update` when only the frontends `touched` can differ from what was
    /// written (one Service changed): the others are not compared, and the
    /// external ports are computed again only if a touched frontend is
    /// reached from outside (before or now).
    pub fn update_touched(
        &mut self,
        desired: &BTreeMap<FrontendKey, Target>,
        touched: &BTreeSet<FrontendKey>,
        node_addresses: &[IpAddr],
        own: &[IpAddr],
    ) {
        let outside = |map: &BTreeMap<FrontendKey, Target>| {
            touched
                .iter()
                .filter_map(|key| map.get(key))
                .any(|target| target.outside != Outside::No)
        };
        let ports = if self.unsettled || outside(&self.written) || outside(desired) {
            external_ports(desired)
        } else {
            self.wanted_ports.clone()
        };
        let scope = if self.unsettled {
            // A failed step may be anywhere: all compared again.
            Scope::All
        } else {
            Scope::Keys(touched)
        };
        self.apply(desired, scope, ports, node_addresses, own);
    }

    fn apply(
        &mut self,
        desired: &BTreeMap<FrontendKey, Target>,
        scope: Scope<'_>,
        ports: BTreeMap<u16, u32>,
        node_addresses: &[IpAddr],
        own: &[IpAddr],
    ) {
        let start = Instant::now();
        let errors_before = self.metrics.service_errors.get();
        self.update_node_addresses(node_addresses, own);
        // A port's bits gained before the frontends on it are put, lost
        // after they are deleted: a bit without its frontend only costs a
        // call or packet a lookup, a frontend without its bit would not
        // answer.
        self.write_ports(&ports, Change::Gained);
        let departed = departed(&self.written, desired, scope);
        for step in steps(&self.written, desired, scope) {
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
        self.departures.send(departed);
        self.unsettled = self.metrics.service_errors.get() != errors_before;
    }

    /// Whether the last update wrote everything it meant to.
    pub fn settled(&self) -> bool {
        !self.unsettled
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
}

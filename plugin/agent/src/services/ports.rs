//! `EXTERNAL_PORTS` as the agent keeps it: which protocols' NodePorts and
//! external addresses listen on each port number, kept from the frontends
//! the agent writes (a port's bits gained before its frontends are put,
//! lost after they are deleted).

use std::collections::{BTreeMap, BTreeSet};

use flatnet_common::external_port;
use flatnet_datapath::bpf::{Datapath, Outside};

use crate::metrics::AgentMetrics;
use crate::services::plan::{FrontendKey, Target};

/// The `EXTERNAL_PORTS` bits of each port that frontends outside clients
/// reach listen on: a NodePort's (the wildcard address) or an external
/// address's, per protocol; and all of them on `ANY_PORT`.
pub fn external_ports(desired: &BTreeMap<FrontendKey, Target>) -> BTreeMap<u16, u32> {
    let mut ports = BTreeMap::new();
    for ((address, port, protocol), target) in desired {
        if target.outside == Outside::No {
            continue;
        }
        let bit = if address.is_unspecified() {
            external_port::nodeport_bit(*protocol)
        } else {
            external_port::address_bit(*protocol)
        };
        *ports.entry(*port).or_default() |= bit;
    }
    if let Some(any) = ports.values().copied().reduce(|a, b| a | b) {
        ports.insert(external_port::ANY_PORT, any);
    }
    ports
}

/// Holds the bits of ports about to lose them (`written` against
/// `wanted`) while established TCP flows from outside still use them: a
/// deleted Service (or a changed NodePort) leaves its connections be, as
/// kube-proxy's conntrack carries them on; new ones find no frontend and
/// are refused. UDP flows are not held (kube-proxy clears their entries).
/// `ANY_PORT` gets the held bits too (`from_pod` asks the reply path only
/// then). Returns the ports held; asked again at each resync until their
/// flows close or expire.
pub fn hold_for_live_flows(
    datapath: &Datapath,
    written: &BTreeMap<u16, u32>,
    wanted: &mut BTreeMap<u16, u32>,
) -> BTreeSet<u16> {
    let losing: Vec<u16> = written
        .iter()
        .filter(|(port, bits)| {
            **port != external_port::ANY_PORT
                && **bits & !wanted.get(port).copied().unwrap_or(0) != 0
        })
        .map(|(port, _)| *port)
        .collect();
    if losing.is_empty() {
        return BTreeSet::new();
    }
    let live: BTreeSet<u16> = match datapath.nat_flows() {
        Ok(flows) => flows
            .iter()
            .filter(|flow| flow.protocol == 6 && !flow.closing)
            .map(|flow| flow.frontend.port())
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the translated flows: ports kept");
            losing.iter().copied().collect()
        }
    };
    let mut held = BTreeSet::new();
    for port in losing.into_iter().filter(|port| live.contains(port)) {
        let bits = written[&port];
        *wanted.entry(port).or_default() |= bits;
        *wanted.entry(external_port::ANY_PORT).or_default() |= bits;
        held.insert(port);
    }
    held
}

/// Which way a map entry's bits change.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Gained,
    Lost,
}

/// Writes the ports whose bits `wanted` changes the `change` way (a port
/// that gains a bit counts as gained); `written` is what the map holds.
pub fn update(
    datapath: &Datapath,
    metrics: &AgentMetrics,
    written: &mut BTreeMap<u16, u32>,
    wanted: &BTreeMap<u16, u32>,
    change: Change,
) {
    let ports: BTreeSet<u16> = wanted.keys().chain(written.keys()).copied().collect();
    for port in ports {
        let had = written.get(&port).copied().unwrap_or(0);
        let bits = wanted.get(&port).copied().unwrap_or(0);
        let this_change = if bits & !had != 0 {
            Change::Gained
        } else {
            Change::Lost
        };
        if bits == had || this_change != change {
            continue;
        }
        match datapath.set_external_port(port, bits) {
            Ok(()) if bits == 0 => {
                written.remove(&port);
            }
            Ok(()) => {
                written.insert(port, bits);
            }
            Err(e) => {
                metrics.service_errors.inc();
                tracing::warn!(error = %e, port, "cannot write an external port");
            }
        }
    }
}

//! `EXTERNAL_PORTS`: which protocols' NodePorts and external addresses
//! listen on each port number, kept from the frontends the agent writes
//! (a port's bits gained before its frontends are put, lost after they
//! are deleted).

use std::collections::{BTreeMap, BTreeSet};

use flatnet_common::external_port;
use flatnet_datapath::bpf::{Datapath, Outside};

use crate::metrics::AgentMetrics;
use crate::services::sync::{FrontendKey, Target};

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

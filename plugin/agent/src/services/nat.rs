//! The uplink program's translated flows (NodePorts and external
//! addresses for clients outside the node, `--services ebpf`): each is
//! forgotten, both ways, once idle past its protocol's timeout, as the
//! kernel's conntrack forgets a flow (and kube-proxy tunes it): so a full
//! table holds live flows, and the LRU only ever evicts under real load.
//! The tables are pinned, so flows live through an agent restart and a
//! datapath upgrade; the next agent's first pass collects what went idle
//! meanwhile. A UDP flow whose backend left its Service is forgotten at
//! once, as kube-proxy clears such conntrack entries.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use flatnet_common::{MAP_NAT_FORWARD, MAX_NAT_FLOWS};
use flatnet_datapath::bpf::{Datapath, NatFlow};

use crate::metrics::AgentMetrics;
use crate::services::plan::FrontendKey;

/// An established TCP flow's idle timeout (kube-proxy's
/// `--conntrack-tcp-timeout-established` default).
const TCP_IDLE: Duration = Duration::from_secs(24 * 3600);
/// A TCP flow that saw a FIN or RST.
const TCP_CLOSING: Duration = Duration::from_secs(60);
/// A UDP flow (the kernel's `nf_conntrack_udp_timeout_stream`).
const UDP_IDLE: Duration = Duration::from_secs(120);

/// Whether a flow of IP protocol `protocol`, idle for `idle`, is done.
pub fn expired(protocol: u8, closing: bool, idle: Duration) -> bool {
    let timeout = match (protocol, closing) {
        (6, false) => TCP_IDLE,
        (6, true) => TCP_CLOSING,
        _ => UDP_IDLE,
    };
    idle > timeout
}

/// The monotonic clock the datapath stamps flows with (`bpf_ktime_get_ns`).
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| Duration::from(t).as_nanos() as u64)
        .unwrap_or(0)
}

/// Whether a translated flow (`protocol`, to `frontend`, sent to
/// `backend`) is a UDP flow whose backend left that frontend (`departed`
/// pairs are the sync's: a wildcard frontend is a NodePort on any node
/// address): kube-proxy deletes such flows' conntrack entries, so the
/// client's next datagram picks a live backend. TCP flows stay, as with
/// kube-proxy: they end with their connection.
pub fn udp_departed(
    protocol: u8,
    frontend: SocketAddr,
    backend: SocketAddr,
    departed: &BTreeSet<(FrontendKey, SocketAddr)>,
) -> bool {
    protocol == 17
        && departed.iter().any(|((address, port, proto), gone)| {
            *proto == protocol
                && *gone == backend
                && *port == frontend.port()
                && (address.is_unspecified() || *address == frontend.ip())
        })
}

/// Forgets the UDP flows whose backend left their frontend.
pub fn forget_departed(
    datapath: &Datapath,
    metrics: &AgentMetrics,
    departed: &BTreeSet<(FrontendKey, SocketAddr)>,
) {
    if departed.is_empty() {
        return;
    }
    let Ok(flows) = datapath.nat_flows() else {
        return;
    };
    for flow in flows
        .iter()
        .filter(|f| udp_departed(f.protocol, f.frontend, f.backend, departed))
    {
        match datapath.forget_nat_flow(flow) {
            Ok(()) => {
                metrics.nat_expired.inc();
            }
            Err(e) => tracing::warn!(error = %e, ?flow, "cannot forget a translated flow"),
        }
    }
}

/// One collection pass: idle flows forgotten, the table's use counted.
pub fn collect(datapath: &Datapath, metrics: &AgentMetrics) {
    // The table's size as made (sized for the node), else the built-in.
    let capacity = datapath.capacity(MAP_NAT_FORWARD).ok().flatten();
    metrics
        .nat_flows_max
        .set(i64::from(capacity.unwrap_or(MAX_NAT_FLOWS)));
    let flows = match datapath.nat_flows() {
        Ok(flows) => flows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the translated flows");
            return;
        }
    };
    let now = monotonic_ns();
    let mut forgotten = 0;
    for flow in &flows {
        let idle = Duration::from_nanos(now.saturating_sub(flow.last_ns));
        if !expired(flow.protocol, flow.closing, idle) {
            continue;
        }
        match datapath.forget_nat_flow(flow) {
            Ok(()) => forgotten += 1,
            Err(e) => tracing::warn!(error = %e, ?flow, "cannot forget a translated flow"),
        }
    }
    metrics.nat_flows.set((flows.len() - forgotten) as i64);
    let orphans = collect_orphans(datapath, &flows, now);
    metrics.nat_expired.inc_by((forgotten + orphans) as u64);
    if forgotten + orphans > 0 {
        tracing::info!(
            forgotten,
            orphans,
            left = flows.len() - forgotten,
            "collected idle translated flows and ways back no flow leads to"
        );
    }
}

/// Ways back no flow leads to (a client reopened its tuple, or the LRU
/// forgot the forward entry first), forgotten once idle past a closed TCP
/// flow's timeout (UDP: its own): none serves a connection any more, and
/// a new flow may be writing one it has not yet led to. How many went.
fn collect_orphans(datapath: &Datapath, flows: &[NatFlow], now: u64) -> usize {
    let orphans = match datapath.orphan_nat_replies(flows) {
        Ok(orphans) => orphans,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the translated flows' ways back");
            return 0;
        }
    };
    let mut forgotten = 0;
    for orphan in &orphans {
        let idle = Duration::from_nanos(now.saturating_sub(orphan.last_ns));
        if !expired(orphan.protocol, true, idle) {
            continue;
        }
        match datapath.forget_orphan_nat_reply(orphan) {
            Ok(()) => forgotten += 1,
            Err(e) => tracing::warn!(error = %e, ?orphan, "cannot forget a way back"),
        }
    }
    forgotten
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_protocol_and_state_has_its_timeout() {
        let minute = Duration::from_secs(61);
        // A closing TCP flow goes after a minute, an established one stays.
        assert!(expired(6, true, minute));
        assert!(!expired(6, false, minute));
        assert!(expired(6, false, Duration::from_secs(24 * 3600 + 1)));
        // UDP: two minutes, closing or not (it has no FIN).
        assert!(!expired(17, false, minute));
        assert!(expired(17, false, Duration::from_secs(121)));
    }

    #[test]
    fn only_udp_flows_to_a_departed_backend_of_their_frontend_are_forgotten() {
        let backend: SocketAddr = "10.244.1.5:8080".parse().unwrap();
        let node_port: SocketAddr = "172.30.0.1:30080".parse().unwrap();
        let departed = BTreeSet::from([(("0.0.0.0".parse().unwrap(), 30080, 17), backend)]);
        assert!(udp_departed(17, node_port, backend, &departed));
        // TCP stays; another backend, another port stay.
        assert!(!udp_departed(6, node_port, backend, &departed));
        let other: SocketAddr = "10.244.1.6:8080".parse().unwrap();
        assert!(!udp_departed(17, node_port, other, &departed));
        let other_port: SocketAddr = "172.30.0.1:30081".parse().unwrap();
        assert!(!udp_departed(17, other_port, backend, &departed));
    }
}

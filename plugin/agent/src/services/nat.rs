//! The uplink program's translated flows (NodePorts and external
//! addresses for clients outside the node, `--services ebpf`): each is
//! forgotten, both ways, once idle past its protocol's timeout, as the
//! kernel's conntrack forgets a flow (and kube-proxy tunes it): so a full
//! table holds live flows, and the LRU only ever evicts under real load.
//! The tables are pinned, so flows live through an agent restart and a
//! datapath upgrade; the next agent's first pass collects what went idle
//! meanwhile.

use std::time::Duration;

use flatnet_common::MAX_NAT_FLOWS;
use flatnet_datapath::bpf::Datapath;

use crate::metrics::AgentMetrics;

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

/// One collection pass: idle flows forgotten, the table's use counted.
pub fn collect(datapath: &Datapath, metrics: &AgentMetrics) {
    metrics.nat_flows_max.set(i64::from(MAX_NAT_FLOWS));
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
    metrics.nat_expired.inc_by(forgotten as u64);
    if forgotten > 0 {
        tracing::info!(
            forgotten,
            left = flows.len() - forgotten,
            "collected idle translated flows"
        );
    }
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
}

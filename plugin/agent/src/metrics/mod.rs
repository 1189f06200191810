//! Prometheus metrics on a local port: the datapath's counters, read from
//! the pinned maps at each scrape, and the agent's own state.
//!
//! - `flatnet_datapath_packets_total{action}` / `flatnet_datapath_bytes_total{action}`:
//!   what the eBPF programs did (`redirected`, `to_remote_node`, `uplink_to_pod`, ...).
//! - `flatnet_pod_{tx,rx}_{packets,bytes}_total{host_veth_ifindex}`: per pod.
//! - `flatnet_policy_denied_packets_total{host_veth_ifindex,direction}`:
//!   what NetworkPolicy dropped of each pod's traffic (`POLICY_DROPS`).
//! - `flatnet_remote_cidrs`: entries of the fast path's remote-CIDR tries.
//! - `flatnet_agent_ready`, `flatnet_agent_feature_ready{feature}` (0 while
//!   NetworkPolicy or eBPF Services is down: a watch cannot list),
//!   `flatnet_peer_nodes`, `flatnet_peer_routes`,
//!   `flatnet_peer_routes_missing` (not in place now),
//!   `flatnet_route_failures_total` (failed kernel requests),
//!   `flatnet_peer_updates_total`, `flatnet_peer_source_errors_total`,
//!   `flatnet_resync_seconds` (histogram: one periodic re-check of the
//!   node, what an idle agent spends its CPU on).
//! - With `--cri-socket`: `flatnet_ipam_reclaimed_total` (attachments whose
//!   DEL never came, released), `flatnet_ipam_allocations{range}` (addresses
//!   in use per pod CIDR), `flatnet_ipam_reclaim_waiting` (without a sandbox,
//!   inside the grace period), `flatnet_ipam_reclaim_passes_total`,
//!   `flatnet_ipam_reclaim_failures_total`.
//! - With `--network-policy` (Kubernetes peer source):
//!   `flatnet_policy_compute_seconds` (histogram: one computation of the
//!   node's plan), `flatnet_policy_isolated_pods{direction}` (pods of this
//!   node isolated for ingress / egress in the last plan),
//!   `flatnet_policy_updates_total` (pods whose policy was written to the
//!   datapath), `flatnet_policy_peer_addresses` and
//!   `flatnet_policy_identities` (peer addresses whose identity a local
//!   pod's table names, and those identities: the node's policy state
//!   grows with them, not with peers times tables),
//!   `flatnet_bpf_map_pressure{map}` (entries over capacity of each
//!   policy map, from what the agent wrote: 1 is full), `flatnet_policy_errors_total` (pods whose policy could not
//!   be computed or written, and broken policy watches).
//! - With `--services ebpf`: `flatnet_services`, `flatnet_service_backends`,
//!   `flatnet_service_update_seconds`, `flatnet_service_errors_total`,
//!   `flatnet_service_sockets_destroyed_total` (TCP connections and
//!   connected UDP sockets whose backend left their Service),
//!   `flatnet_nat_flows` and `flatnet_nat_flows_max` (flows from outside
//!   the node that the uplink translated, as the last collection counted
//!   them, and what the table holds: its pressure),
//!   `flatnet_nat_expired_total` (idle ones collected, and ways back no
//!   flow leads to).
//! - How long a change takes to reach the datapath (`latency`):
//!   `flatnet_network_programming_duration_seconds` (kube-proxy's meaning,
//!   `--services ebpf`) and `flatnet_change_to_datapath_seconds{kind}`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::error::{AgentError, Result};
use datapath::DatapathCollector;
use flatnet_datapath::bpf::Datapath;

mod datapath;
pub mod latency;

/// The agent's own metrics, updated as it works.
#[derive(Debug, Default, Clone)]
pub struct AgentMetrics {
    pub ready: Gauge,
    pub peer_nodes: Gauge,
    pub peer_routes: Gauge,
    pub peer_routes_missing: Gauge,
    pub route_failures: Counter,
    pub peer_updates: Counter,
    pub resync: ComputeSeconds,
    pub source_errors: Counter,
    pub ipam_reclaimed: Counter,
    pub ipam_allocations: Family<RangeLabel, Gauge>,
    pub reclaim_waiting: Gauge,
    pub reclaim_passes: Counter,
    pub reclaim_failures: Counter,
    pub policy_compute: ComputeSeconds,
    pub policy_isolated: Family<DirectionLabel, Gauge>,
    pub policy_updates: Counter,
    pub policy_peer_addresses: Gauge,
    pub map_pressure: Family<MapLabel, Gauge<f64, AtomicU64>>,
    pub policy_identities: Gauge,
    pub policy_errors: Counter,
    pub services: Gauge,
    pub service_backends: Gauge,
    pub service_update: ComputeSeconds,
    pub service_errors: Counter,
    pub service_sockets_destroyed: Counter,
    pub nat_flows: Gauge,
    pub nat_flows_max: Gauge,
    pub nat_expired: Counter,
    pub change_latency: latency::ChangeLatency,
    /// 0 for each feature that is down (`network_policy`, ...), 1 when up.
    pub feature_ready: Family<FeatureLabel, Gauge>,
    /// Why the agent is not ready, for `/readyz` (not a metric).
    pub not_ready: Arc<std::sync::Mutex<Vec<String>>>,
}

/// `network_policy`, `services_ebpf`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabel {
    pub feature: String,
}

/// A BPF map's name (`POLICY_PEERS`, ...).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabel {
    pub map: String,
}

/// `ingress` or `egress`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: String,
}

/// Seconds one policy plan took to compute: buckets from 100 µs to ~3 s
/// (a node's plan is a few ms; the histogram shows when a cluster's size
/// makes it more).
#[derive(Debug, Clone)]
pub struct ComputeSeconds(pub Histogram);

impl Default for ComputeSeconds {
    fn default() -> Self {
        ComputeSeconds(Histogram::new(exponential_buckets(0.0001, 2.0, 16)))
    }
}

/// A pod CIDR of this node (one flatnet-ipam range set).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RangeLabel {
    pub range: String,
}

/// The registry with everything the agent exposes.
pub fn registry(datapath: &Datapath, agent: &AgentMetrics) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        "flatnet_agent_ready",
        "1 while the node's own setup is complete at the last pass (datapath, uplink program, conflist)",
        agent.ready.clone(),
    );
    registry.register(
        "flatnet_agent_feature_ready",
        "1 while a feature the agent was started with works, 0 while it is down (its watches cannot list)",
        agent.feature_ready.clone(),
    );
    registry.register(
        "flatnet_peer_nodes",
        "Other nodes in the peer list",
        agent.peer_nodes.clone(),
    );
    registry.register(
        "flatnet_peer_routes",
        "Routes to other nodes' pod CIDRs this node should have",
        agent.peer_routes.clone(),
    );
    registry.register(
        "flatnet_peer_routes_missing",
        "Routes to other nodes' pod CIDRs that are not in place now (a foreign route in the way, or the write failed)",
        agent.peer_routes_missing.clone(),
    );
    registry.register(
        "flatnet_route_failures",
        "Route writes or removals the kernel refused",
        agent.route_failures.clone(),
    );
    registry.register(
        "flatnet_resync_seconds",
        "Time of one periodic re-check of the node (--resync-secs): routes, maps, attachments, nftables sets, conflist, address reclaim, translated flows",
        agent.resync.0.clone(),
    );
    registry.register(
        "flatnet_peer_updates",
        "Node lists received from the peer source",
        agent.peer_updates.clone(),
    );
    registry.register(
        "flatnet_peer_source_errors",
        "Errors from the peer source (unreadable file, broken watch)",
        agent.source_errors.clone(),
    );
    registry.register(
        "flatnet_ipam_reclaimed",
        "Attachments whose DEL never came, released by the reclaim loop (address, datapath entry, veth)",
        agent.ipam_reclaimed.clone(),
    );
    registry.register(
        "flatnet_ipam_allocations",
        "Addresses flatnet-ipam has handed out and not released, per pod CIDR, at the last reclaim pass",
        agent.ipam_allocations.clone(),
    );
    registry.register(
        "flatnet_ipam_reclaim_waiting",
        "Attachments without a sandbox at the last pass, still inside the grace period",
        agent.reclaim_waiting.clone(),
    );
    registry.register(
        "flatnet_ipam_reclaim_passes",
        "Reclaim passes that compared the allocations with the runtime's sandboxes",
        agent.reclaim_passes.clone(),
    );
    registry.register(
        "flatnet_ipam_reclaim_failures",
        "Reclaim passes or DELs that failed (runtime not answering, a plugin's DEL failing)",
        agent.reclaim_failures.clone(),
    );
    registry.register(
        "flatnet_policy_compute_seconds",
        "Time to compute this node's NetworkPolicy plan after a change",
        agent.policy_compute.0.clone(),
    );
    registry.register(
        "flatnet_policy_isolated_pods",
        "Pods of this node isolated by NetworkPolicy in the last plan, per direction",
        agent.policy_isolated.clone(),
    );
    registry.register(
        "flatnet_policy_peer_addresses",
        "Peer addresses whose identity a table of this node's pods names, in the last plan",
        agent.policy_peer_addresses.clone(),
    );
    registry.register(
        "flatnet_bpf_map_pressure",
        "Entries over capacity of each policy map, as the agent wrote them (1 is full)",
        agent.map_pressure.clone(),
    );
    registry.register(
        "flatnet_policy_identities",
        "Peer identities the tables of this node's pods name, in the last plan",
        agent.policy_identities.clone(),
    );
    registry.register(
        "flatnet_policy_updates",
        "Pods whose NetworkPolicy was written to the datapath",
        agent.policy_updates.clone(),
    );
    registry.register(
        "flatnet_policy_errors",
        "Pods whose NetworkPolicy could not be computed or written, and broken policy watches",
        agent.policy_errors.clone(),
    );
    registry.register(
        "flatnet_services",
        "Service frontends (ClusterIP, port, protocol) in the datapath's Service maps (--services ebpf)",
        agent.services.clone(),
    );
    registry.register(
        "flatnet_service_backends",
        "Backends of those frontends, summed",
        agent.service_backends.clone(),
    );
    registry.register(
        "flatnet_service_update_seconds",
        "Time to bring the Service maps up to date after a Service or EndpointSlice change",
        agent.service_update.0.clone(),
    );
    registry.register(
        "flatnet_service_errors",
        "Service frontends that could not be written or deleted (tried again at the next change)",
        agent.service_errors.clone(),
    );
    registry.register(
        "flatnet_service_sockets_destroyed",
        "Connected sockets of local clients destroyed because their Service backend left (--services ebpf)",
        agent.service_sockets_destroyed.clone(),
    );
    registry.register(
        "flatnet_nat_flows",
        "Flows from outside the node to a NodePort or external address that the uplink program translated, at the last collection (--services ebpf)",
        agent.nat_flows.clone(),
    );
    registry.register(
        "flatnet_nat_flows_max",
        "Flows the translation table holds; past it the least recently used is forgotten",
        agent.nat_flows_max.clone(),
    );
    registry.register(
        "flatnet_nat_expired",
        "Idle translated flows the agent collected",
        agent.nat_expired.clone(),
    );
    agent.change_latency.register(&mut registry);
    registry.register_collector(Box::new(DatapathCollector {
        datapath: datapath.clone(),
    }));
    registry
}

/// The OpenMetrics text of `registry`.
pub fn render(registry: &Registry) -> std::result::Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

#[derive(Clone)]
struct Served {
    registry: Arc<Registry>,
    agent: AgentMetrics,
}

async fn metrics(State(served): State<Served>) -> impl IntoResponse {
    // Reading the maps is a few bpf() calls: fine on the async thread.
    match render(&served.registry) {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// 200 while ready, 503 otherwise: a DaemonSet readiness probe.
async fn readyz(State(served): State<Served>) -> impl IntoResponse {
    if served.agent.ready.get() == 1 {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        let reasons = served
            .agent
            .not_ready
            .lock()
            .map(|r| r.iter().map(|line| format!("{line}\n")).collect::<String>())
            .unwrap_or_default();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready\n{reasons}"),
        )
    }
}

/// Binds `address` now (so a taken port fails the start) and returns the
/// server to run.
pub async fn serve(
    address: SocketAddr,
    registry: Registry,
    agent: AgentMetrics,
) -> Result<impl std::future::Future<Output = std::io::Result<()>>> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| AgentError::io(format!("listening for metrics on {address}"), e))?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .with_state(Served {
            registry: Arc::new(registry),
            agent,
        });
    Ok(async move { axum::serve(listener, app).await })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_metrics_render_without_a_datapath() {
        let agent = AgentMetrics::default();
        agent.ready.set(1);
        agent.peer_nodes.set(2);
        agent.route_failures.inc();
        agent.peer_routes_missing.set(1);
        agent.ipam_reclaimed.inc();
        agent
            .ipam_allocations
            .get_or_create(&RangeLabel {
                range: "10.244.1.0/24".into(),
            })
            .set(3);
        agent.policy_compute.0.observe(0.002);
        agent
            .policy_isolated
            .get_or_create(&DirectionLabel {
                direction: "ingress".into(),
            })
            .set(4);
        agent.policy_updates.inc_by(5);
        let datapath = Datapath::with_root(std::path::Path::new("/nonexistent"), "n");
        let text = render(&registry(&datapath, &agent)).unwrap();
        assert!(text.contains("flatnet_agent_ready 1"), "{text}");
        assert!(text.contains("flatnet_peer_nodes 2"), "{text}");
        assert!(text.contains("flatnet_route_failures_total 1"), "{text}");
        assert!(text.contains("flatnet_peer_routes_missing 1"), "{text}");
        assert!(text.contains("flatnet_ipam_reclaimed_total 1"), "{text}");
        assert!(
            text.contains("flatnet_ipam_allocations{range=\"10.244.1.0/24\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("flatnet_policy_compute_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("flatnet_policy_isolated_pods{direction=\"ingress\"} 4"),
            "{text}"
        );
        assert!(text.contains("flatnet_policy_updates_total 5"), "{text}");
        assert!(text.contains("flatnet_policy_errors_total 0"), "{text}");
        assert!(!text.contains("flatnet_datapath_packets"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}

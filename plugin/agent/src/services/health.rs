//! `healthCheckNodePort`, served as kube-proxy serves it: for each Service
//! with `externalTrafficPolicy: Local` and a health check port, an HTTP
//! server on that port of every node address answers any GET with the
//! Service's name and how many of its endpoints are on this node: 200 when
//! there is one, 503 when there is none, so a load balancer sends outside
//! clients only to nodes that can serve them (the uplink program drops
//! what reaches a node without one).

use std::collections::BTreeMap;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tokio::task::JoinHandle;

use crate::services::Frontend;

/// What one health check port answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub namespace: String,
    pub name: String,
    /// This node's endpoints of the Service (distinct addresses).
    pub local_endpoints: usize,
}

/// The health checks `frontends` ask for, by port.
pub fn checks(frontends: &[Frontend<'_>]) -> BTreeMap<u16, HealthCheck> {
    frontends
        .iter()
        .filter(|f| f.external_local)
        .filter_map(|frontend| {
            let port = frontend.health_check_node_port?;
            Some((
                port,
                HealthCheck {
                    namespace: frontend.namespace.to_string(),
                    name: frontend.name.to_string(),
                    local_endpoints: frontend.local_ready_endpoints,
                },
            ))
        })
        .collect()
}

/// The answer to a GET: status and kube-proxy's JSON body.
pub fn answer(check: &HealthCheck) -> (StatusCode, String) {
    let status = if check.local_endpoints > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({
        "service": {"namespace": check.namespace, "name": check.name},
        "localEndpoints": check.local_endpoints,
        "serviceProxyHealthy": true,
    });
    (status, body.to_string())
}

/// The running servers, one per port, each answering from the shared
/// table (a changed count needs no new server).
#[derive(Default)]
pub struct HealthServers {
    table: Arc<Mutex<BTreeMap<u16, HealthCheck>>>,
    servers: BTreeMap<u16, JoinHandle<()>>,
}

impl HealthServers {
    /// Serves `wanted`: servers started for new ports, stopped for gone
    /// ones. A port that cannot be bound is logged and tried again at the
    /// next update.
    pub fn update(&mut self, wanted: BTreeMap<u16, HealthCheck>) {
        if let Ok(mut table) = self.table.lock() {
            *table = wanted.clone();
        }
        self.servers.retain(|port, server| {
            let keep = wanted.contains_key(port);
            if !keep {
                server.abort();
            }
            keep
        });
        for port in wanted.keys() {
            if self.servers.contains_key(port) {
                continue;
            }
            // Both families on one socket (IPV6_V6ONLY off, Linux's default).
            let address = SocketAddr::from((Ipv6Addr::UNSPECIFIED, *port));
            let listener = match std::net::TcpListener::bind(address)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
            {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::warn!(error = %e, port, "cannot serve a healthCheckNodePort");
                    continue;
                }
            };
            let app = Router::new()
                .fallback(serve)
                .with_state((self.table.clone(), *port));
            let server = tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::warn!(error = %e, "a healthCheckNodePort server stopped");
                }
            });
            tracing::info!(port, "serving a healthCheckNodePort");
            self.servers.insert(*port, server);
        }
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.abort();
        }
    }
}

type Served = (Arc<Mutex<BTreeMap<u16, HealthCheck>>>, u16);

async fn serve(State((table, port)): State<Served>) -> impl IntoResponse {
    let check = table.lock().ok().and_then(|t| t.get(&port).cloned());
    let (status, body) = match check {
        Some(check) => answer(&check),
        None => (StatusCode::NOT_FOUND, String::new()),
    };
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::Protocol;
    use crate::services::FrontendPort;

    fn lb(local: &[&str], health_port: Option<u16>, local_policy: bool) -> Frontend<'static> {
        Frontend {
            namespace: "ns",
            name: "lb",
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            external_ips: Vec::new(),
            affinity: None::<Duration>,
            external_local: local_policy,
            health_check_node_port: health_port,
            local_ready_endpoints: local.len(),
            ports: vec![FrontendPort {
                name: String::new(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: Some(30080),
                backends: Vec::new(),
                local_backends: local.iter().map(|a| (a.parse().unwrap(), 8080)).collect(),
            }],
        }
    }

    #[test]
    fn a_local_policy_with_a_port_is_checked_and_counts_this_nodes_endpoints() {
        let checks = checks(&[
            lb(&["10.244.0.5", "10.244.0.6"], Some(32000), true),
            lb(&[], Some(32001), true),
            lb(&["10.244.0.7"], Some(32002), false),
            lb(&["10.244.0.8"], None, true),
        ]);
        assert_eq!(
            checks.keys().copied().collect::<Vec<_>>(),
            vec![32000, 32001]
        );
        let (status, body) = answer(&checks[&32000]);
        assert_eq!(status, StatusCode::OK);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["localEndpoints"], 2);
        assert_eq!(body["service"]["name"], "lb");
        assert_eq!(answer(&checks[&32001]).0, StatusCode::SERVICE_UNAVAILABLE);
    }
}

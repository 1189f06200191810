//! A Service as the agent keeps it: what kube-proxy reads of one, decoded
//! straight from the API server's JSON (the rest skipped, never held:
//! selector, IP families, target ports, labels, ...), in a store of the
//! agent's own (`policy::object_store`). k8s-openapi's Service held 1.8 KB
//! each at the scale harness's xl size, 17 MB for 10,000. Field names and
//! the small types (session affinity, load-balancer status) are
//! k8s-openapi's, so code reads it alike.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerStatus, SessionAffinityConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::not_for_this_proxy;
use crate::policy::object_store::{Named, Watched};
use crate::slim::{ServedMetadata, watched_as};

/// A Service (v1), slim.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Served")]
pub struct Service {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// Labelled headless or another proxy's: kube-proxy's informers select
    /// it away, and so does flatnet.
    pub not_for_this_proxy: bool,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

/// A Service as kube's watcher decodes it: the slim [`Service`], and the
/// metadata the watcher reads (the resourceVersion it resumes from).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Served")]
pub struct WatchedService {
    pub metadata: ObjectMeta,
    pub service: Service,
}

/// A Service as served, with only the fields kept.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Served {
    metadata: ServedMetadata,
    spec: Option<ServiceSpec>,
    status: Option<ServiceStatus>,
}

impl From<Served> for WatchedService {
    fn from(mut served: Served) -> Self {
        WatchedService {
            metadata: served.metadata.for_watcher(),
            service: Service::from(served),
        }
    }
}

impl From<Served> for Service {
    fn from(served: Served) -> Self {
        let mut meta = served.metadata;
        let (namespace, name) = meta.key();
        Service {
            namespace,
            name,
            not_for_this_proxy: not_for_this_proxy(&meta.labels),
            spec: served.spec,
            status: served.status,
        }
    }
}

impl Named for Service {
    fn namespace(&self) -> &Arc<str> {
        &self.namespace
    }

    fn name(&self) -> &Arc<str> {
        &self.name
    }
}

impl Watched for WatchedService {
    type Object = Service;

    fn object(&self) -> &Service {
        &self.service
    }
}

impl From<WatchedService> for Service {
    fn from(watched: WatchedService) -> Self {
        watched.service
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<String>>,
    #[serde(rename = "externalIPs")]
    pub external_ips: Option<Vec<String>>,
    pub session_affinity: Option<String>,
    pub session_affinity_config: Option<SessionAffinityConfig>,
    pub internal_traffic_policy: Option<String>,
    pub external_traffic_policy: Option<String>,
    pub health_check_node_port: Option<i32>,
    pub ports: Option<Vec<ServicePort>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServicePort {
    pub name: Option<String>,
    pub protocol: Option<String>,
    pub port: i32,
    pub node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceStatus {
    pub load_balancer: Option<LoadBalancerStatus>,
}

watched_as!(WatchedService, k8s_openapi::api::core::v1::Service);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::metrics::latency::TRIGGER_TIME;

    #[test]
    fn a_service_keeps_what_kube_proxy_reads_under_the_apis_names() {
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "9",
                "labels": {"app": "web"},
                "annotations": {TRIGGER_TIME: "2026-11-30T10:00:00Z", "other": "x"},
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.7",
                "clusterIPs": ["10.96.0.7", "fd96::7"], "externalIPs": ["192.0.2.7"],
                "ipFamilies": ["IPv4", "IPv6"], "selector": {"app": "web"},
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "internalTrafficPolicy": "Local", "externalTrafficPolicy": "Local",
                "healthCheckNodePort": 32000, "trafficDistribution": "PreferClose",
                "ports": [{"name": "http", "protocol": "TCP", "port": 80,
                           "targetPort": "web", "nodePort": 30080}]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7", "ipMode": "VIP"}]}}
        }))
        .unwrap();
        assert_eq!((&*service.namespace, &*service.name), ("shop", "web"));
        assert!(!service.not_for_this_proxy);
        let spec = service.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.7"));
        assert_eq!(spec.cluster_ips.unwrap().len(), 2);
        assert_eq!(spec.external_ips.unwrap(), ["192.0.2.7"]);
        let timeout = spec.session_affinity_config.unwrap().client_ip.unwrap();
        assert_eq!(timeout.timeout_seconds, Some(60));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.health_check_node_port, Some(32000));
        let port = &spec.ports.unwrap()[0];
        assert_eq!(
            (
                port.name.as_deref(),
                port.protocol.as_deref(),
                port.port,
                port.node_port
            ),
            (Some("http"), Some("TCP"), 80, Some(30080))
        );
        let ingress = service
            .status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap();
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));
    }
}

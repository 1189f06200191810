//! A Pod as the agent keeps it: the few fields policy reads, decoded
//! straight from the API server's JSON (the rest is skipped, never held).
//!
//! k8s-openapi's `Pod` is 2.4 KiB before any field is set, and each
//! container another 2.3 KiB: most of the agent's memory in a big cluster,
//! where every pod is watched (peers can be anywhere). This one keeps the
//! namespace and name, the labels, the node, host networking, container
//! ports (named ports), the phase and the addresses (parsed); what pods
//! repeat (namespace, labels, ports, node, phase) is one shared copy
//! (`interned`). No `ObjectMeta` (15 fields, ~330 B before any is set):
//! kube's watcher decodes a [`WatchedPod`], which carries the
//! resourceVersion it resumes from, and the agent's own store
//! (`object_store`) keeps the [`Pod`] inside.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::interned::Interner;
use crate::slim::watched_as;

/// A pod's labels, shared with every pod that has the same.
pub type Labels = Arc<BTreeMap<String, String>>;

static LABELS: LazyLock<Interner<BTreeMap<String, String>>> = LazyLock::new(Interner::new);
static CONTAINERS: LazyLock<Interner<[Container]>> = LazyLock::new(Interner::new);

/// The shared copy of a label set.
pub fn labels(labels: BTreeMap<String, String>) -> Labels {
    LABELS.get(&labels, || Arc::new(labels.clone()))
}

/// A Pod (core/v1), slim. A missing field is its default (no labels, no
/// node, no addresses, not on the host network).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Served")]
pub struct Pod {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub labels: Labels,
    pub node_name: Option<Arc<str>>,
    pub host_network: bool,
    pub containers: Arc<[Container]>,
    pub phase: Option<Arc<str>>,
    /// `podIPs` (or `podIP` without them), parsed, sorted, each once;
    /// unparsable ones left out.
    pub ips: Box<[IpAddr]>,
}

/// A Pod as kube's watcher decodes it: the slim [`Pod`], and the metadata
/// the watcher reads (the resourceVersion it resumes from).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Served")]
pub struct WatchedPod {
    pub metadata: ObjectMeta,
    pub pod: Pod,
}

/// A container: only its ports.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(default)]
pub struct Container {
    pub ports: Option<Vec<ContainerPort>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: i32,
    pub protocol: Option<String>,
}

/// A Pod as served, with only the fields kept; annotations,
/// managedFields, owners and the rest are skipped while decoding.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Served {
    metadata: ServedMetadata,
    spec: ServedSpec,
    status: ServedStatus,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ServedMetadata {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ServedSpec {
    node_name: Option<String>,
    host_network: Option<bool>,
    containers: Vec<Container>,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ServedStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<PodIp>>,
}

#[derive(Deserialize)]
struct PodIp {
    ip: String,
}

impl From<Served> for WatchedPod {
    fn from(served: Served) -> Self {
        let metadata = ObjectMeta {
            name: served.metadata.name.clone(),
            namespace: served.metadata.namespace.clone(),
            resource_version: served.metadata.resource_version.clone(),
            ..ObjectMeta::default()
        };
        WatchedPod {
            metadata,
            pod: Pod::from(served),
        }
    }
}

impl From<Served> for Pod {
    fn from(served: Served) -> Self {
        let (meta, spec, status) = (served.metadata, served.spec, served.status);
        Pod {
            namespace: crate::interned::name(meta.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(meta.name.unwrap_or_default()),
            labels: labels(meta.labels.unwrap_or_default()),
            node_name: spec.node_name.as_deref().map(crate::interned::name),
            host_network: spec.host_network == Some(true),
            containers: CONTAINERS.get(spec.containers.as_slice(), || {
                spec.containers.clone().into()
            }),
            phase: status.phase.as_deref().map(crate::interned::name),
            ips: addresses(status.pod_ips, status.pod_ip),
        }
    }
}

/// `podIPs`, or `podIP` when they are missing or empty.
fn addresses(listed: Option<Vec<PodIp>>, single: Option<String>) -> Box<[IpAddr]> {
    let mut ips: Vec<IpAddr> = match listed {
        Some(ips) if !ips.is_empty() => ips.iter().filter_map(|i| i.ip.parse().ok()).collect(),
        _ => single.and_then(|i| i.parse().ok()).into_iter().collect(),
    };
    ips.sort();
    ips.dedup();
    ips.into()
}

/// The agent's pods.
pub type PodStore = super::object_store::ObjectStore<Pod>;

impl From<WatchedPod> for Pod {
    fn from(watched: WatchedPod) -> Self {
        watched.pod
    }
}

impl super::object_store::Watched for WatchedPod {
    type Object = Pod;

    fn object(&self) -> &Pod {
        &self.pod
    }
}

impl super::object_store::Named for Pod {
    fn namespace(&self) -> &Arc<str> {
        &self.namespace
    }

    fn name(&self) -> &Arc<str> {
        &self.name
    }
}

watched_as!(WatchedPod, k8s_openapi::api::core::v1::Pod);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A Pod as the API server sends it, with what a real one carries.
    fn served() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "7d3c", "resourceVersion": "4711",
                "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "1"}],
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {
                "nodeName": "node-1", "hostNetwork": false, "serviceAccountName": "default",
                "containers": [{"name": "web", "image": "nginx", "env": [{"name": "A", "value": "b"}],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}],
                "volumes": [{"name": "token", "projected": {"sources": []}}]
            },
            "status": {
                "phase": "Running", "podIP": "10.0.1.5", "podIPs": [{"ip": "10.0.1.5"}, {"ip": "fd00::5"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "image": "nginx", "imageID": "x"}]
            }
        })
    }

    #[test]
    fn keeps_what_policy_reads_and_nothing_else() {
        let pod: Pod = serde_json::from_value(served()).unwrap();
        assert_eq!((&*pod.namespace, &*pod.name), ("shop", "web-1"));
        assert_eq!(pod.labels["app"], "web");
        assert_eq!(pod.node_name.as_deref(), Some("node-1"));
        assert!(!pod.host_network);
        let port = &pod.containers[0].ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("http"), 8080)
        );
        assert_eq!(port.protocol.as_deref(), Some("TCP"));
        assert_eq!(pod.phase.as_deref(), Some("Running"));
        let ips: Vec<String> = pod.ips.iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["10.0.1.5", "fd00::5"]);
    }

    #[test]
    fn the_watcher_gets_the_resource_version_and_nothing_else_of_the_metadata() {
        let watched: WatchedPod = serde_json::from_value(served()).unwrap();
        let meta = &watched.metadata;
        assert_eq!(meta.resource_version.as_deref(), Some("4711"));
        assert_eq!(meta.name.as_deref(), Some("web-1"));
        assert!(meta.labels.is_none() && meta.annotations.is_none());
        assert!(meta.managed_fields.is_none() && meta.uid.is_none());
        assert_eq!(&*watched.pod.name, "web-1");
    }

    #[test]
    fn pods_alike_share_their_namespace_labels_ports_node_and_phase() {
        let one: Pod = serde_json::from_value(served()).unwrap();
        let mut json = served();
        json["metadata"]["name"] = json!("web-2");
        json["status"]["podIPs"] = json!([{"ip": "10.0.1.6"}]);
        let two: Pod = serde_json::from_value(json).unwrap();
        assert!(Arc::ptr_eq(&one.namespace, &two.namespace));
        assert!(Arc::ptr_eq(&one.labels, &two.labels));
        assert!(Arc::ptr_eq(&one.containers, &two.containers));
        let node = |p: &Pod| p.node_name.clone().unwrap();
        assert!(Arc::ptr_eq(&node(&one), &node(&two)));
        let phase = |p: &Pod| p.phase.clone().unwrap();
        assert!(Arc::ptr_eq(&phase(&one), &phase(&two)));
        assert_ne!(one.ips, two.ips);
    }

    #[test]
    fn addresses_are_pod_ips_else_pod_ip_parsed_sorted_once() {
        let decode = |status: serde_json::Value| -> Vec<String> {
            let pod: Pod = serde_json::from_value(json!({"status": status})).unwrap();
            pod.ips.iter().map(|i| i.to_string()).collect()
        };
        let both = json!({"podIP": "10.0.0.1", "podIPs": [{"ip": "fd00::1"}, {"ip": "10.0.0.1"}]});
        assert_eq!(decode(both), ["10.0.0.1", "fd00::1"]);
        assert_eq!(
            decode(json!({"podIP": "10.0.0.2", "podIPs": []})),
            ["10.0.0.2"]
        );
        assert_eq!(decode(json!({"podIP": "10.0.0.3"})), ["10.0.0.3"]);
        let bad = json!({"podIPs": [{"ip": "not-an-ip"}, {"ip": "10.0.0.4"}, {"ip": "10.0.0.4"}]});
        assert_eq!(decode(bad), ["10.0.0.4"]);
        assert!(decode(json!({"phase": "Pending"})).is_empty());
    }

    #[test]
    fn a_pod_with_only_a_name_decodes() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
        assert!(pod.labels.is_empty() && pod.containers.is_empty() && pod.ips.is_empty());
        assert!(pod.node_name.is_none() && pod.phase.is_none() && !pod.host_network);
    }

    #[test]
    fn is_watched_as_core_v1_pods() {
        use kube::Resource;
        assert_eq!(WatchedPod::kind(&()), "Pod");
        assert_eq!(WatchedPod::api_version(&()), "v1");
        assert_eq!(WatchedPod::plural(&()), "pods");
        assert_eq!(
            WatchedPod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }

    /// A pod's inline size with one container: a small fraction of
    /// k8s-openapi's (the heap besides, docs/benchmarks.md).
    #[test]
    fn holds_a_fraction_of_the_full_pods_memory() {
        let slim = std::mem::size_of::<Pod>() + std::mem::size_of::<Container>();
        let full = std::mem::size_of::<k8s_openapi::api::core::v1::Pod>()
            + std::mem::size_of::<k8s_openapi::api::core::v1::Container>();
        assert!(slim * 20 < full, "slim {slim} B, full {full} B");
    }
}

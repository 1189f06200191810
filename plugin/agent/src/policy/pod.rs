//! A Pod as the agent keeps it: the few fields policy reads, decoded
//! straight from the API server's JSON (the rest is skipped, never held).
//!
//! k8s-openapi's `Pod` is 2.4 KiB before any field is set, and each
//! container another 2.3 KiB: most of the agent's memory in a big cluster,
//! where every pod is watched (peers can be anywhere). This one keeps
//! name, namespace, labels and resourceVersion (the watch resumes from it),
//! the node, host networking, container ports (named ports), the phase and
//! the addresses. Its field names are k8s-openapi's, so code reads it alike.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// A Pod (core/v1), slim. Every field may be missing, as in k8s-openapi,
/// but a container port's number and an address's `ip`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Pod {
    #[serde(deserialize_with = "slim_metadata")]
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodSpec {
    pub node_name: Option<String>,
    pub host_network: Option<bool>,
    pub containers: Vec<Container>,
}

/// A container: only its ports.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Container {
    pub ports: Option<Vec<ContainerPort>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: i32,
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Option<String>,
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pub pod_ips: Option<Vec<PodIp>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodIp {
    pub ip: String,
}

/// The metadata fields kept; annotations, managedFields, owners and the
/// rest are skipped while decoding.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct KeptMetadata {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
}

fn slim_metadata<'de, D: Deserializer<'de>>(decoder: D) -> Result<ObjectMeta, D::Error> {
    let kept = KeptMetadata::deserialize(decoder)?;
    Ok(ObjectMeta {
        name: kept.name,
        namespace: kept.namespace,
        labels: kept.labels,
        resource_version: kept.resource_version,
        ..ObjectMeta::default()
    })
}

impl k8s_openapi::Resource for Pod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Pod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

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
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-1"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(meta.resource_version.as_deref(), Some("4711"));
        assert_eq!(meta.labels.as_ref().unwrap()["app"], "web");
        assert!(meta.annotations.is_none() && meta.managed_fields.is_none());
        assert!(meta.owner_references.is_none() && meta.uid.is_none());
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(spec.host_network, Some(false));
        let port = &spec.containers[0].ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("http"), 8080)
        );
        assert_eq!(port.protocol.as_deref(), Some("TCP"));
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.1.5"));
        let ips: Vec<&str> = status
            .pod_ips
            .iter()
            .flatten()
            .map(|i| i.ip.as_str())
            .collect();
        assert_eq!(ips, ["10.0.1.5", "fd00::5"]);
    }

    #[test]
    fn a_pod_with_only_a_name_decodes() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
        assert!(pod.spec.is_none() && pod.status.is_none());
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "a"}, "spec": {}})).unwrap();
        assert!(pod.spec.unwrap().containers.is_empty());
    }

    #[test]
    fn is_watched_as_core_v1_pods() {
        use kube::Resource;
        assert_eq!(Pod::kind(&()), "Pod");
        assert_eq!(Pod::api_version(&()), "v1");
        assert_eq!(Pod::plural(&()), "pods");
        assert_eq!(Pod::url_path(&(), Some("ns")), "/api/v1/namespaces/ns/pods");
    }

    /// A pod's inline size with one container: a small fraction of
    /// k8s-openapi's (the heap besides: 1,567 against 5,934 B for the scale
    /// harness's pods, docs/benchmarks.md).
    #[test]
    fn holds_a_fraction_of_the_full_pods_memory() {
        let slim = std::mem::size_of::<Pod>() + std::mem::size_of::<Container>();
        let full = std::mem::size_of::<k8s_openapi::api::core::v1::Pod>()
            + std::mem::size_of::<k8s_openapi::api::core::v1::Container>();
        assert!(slim * 5 < full, "slim {slim} B, full {full} B");
    }
}

//! What the agent's own forms of API objects share (pods, NetworkPolicies,
//! Services, EndpointSlices are kept slim, not in k8s-openapi's types):
//! the metadata Services and EndpointSlices are decoded with, and the two
//! kube traits that let kube's watcher watch a slim type as the API type it
//! stands for.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::metrics::latency::TRIGGER_TIME;

/// The metadata a slim Service or EndpointSlice is decoded with: what it
/// keeps, and the resourceVersion the watcher reads (the rest skipped,
/// never held).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServedMetadata {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub resource_version: Option<String>,
}

impl ServedMetadata {
    /// What kube's watcher reads: name, namespace and resourceVersion
    /// (taken: the object the store keeps has no use for it).
    pub fn for_watcher(&mut self) -> ObjectMeta {
        ObjectMeta {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            resource_version: self.resource_version.take(),
            ..ObjectMeta::default()
        }
    }

    /// Namespace (one copy shared by its objects) and name.
    pub fn key(&mut self) -> (Arc<str>, Arc<str>) {
        let namespace = self.namespace.as_deref().unwrap_or_default();
        (
            crate::interned::name(namespace),
            Arc::from(self.name.take().unwrap_or_default()),
        )
    }

    /// The change's trigger time, taken (the latency metrics read it).
    pub fn trigger_time(&mut self) -> Option<Box<str>> {
        self.annotations.remove(TRIGGER_TIME).map(Box::from)
    }
}

/// Makes `$slim` (a type with a `metadata: ObjectMeta` field) watchable as
/// the API type `$full`: its group, version, kind and path are `$full`'s.
macro_rules! watched_as {
    ($slim:ty, $full:ty) => {
        impl k8s_openapi::Resource for $slim {
            const API_VERSION: &'static str = <$full as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$full as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$full as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$full as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$full as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $slim {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}

pub(crate) use watched_as;

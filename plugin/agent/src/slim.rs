//! What the agent's own forms of API objects share (pods, NetworkPolicies,
//! Services, EndpointSlices are kept slim, not in k8s-openapi's types):
//! the metadata they keep, and the two kube traits that let kube's watcher
//! watch them as the API type they stand for.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use crate::metrics::latency::TRIGGER_TIME;

/// What an object's metadata keeps: name, namespace, labels,
/// resourceVersion (the watcher reads it; the store drops it) and, of the
/// annotations, the change's trigger time (the latency metrics read it).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct KeptMetadata {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
}

/// Decodes an object's metadata, skipping (never holding) what is not kept.
pub fn kept_metadata<'de, D: Deserializer<'de>>(decoder: D) -> Result<ObjectMeta, D::Error> {
    let kept = KeptMetadata::deserialize(decoder)?;
    let trigger = kept
        .annotations
        .and_then(|mut a| a.remove_entry(TRIGGER_TIME))
        .map(|entry| BTreeMap::from([entry]));
    Ok(ObjectMeta {
        name: kept.name,
        namespace: kept.namespace,
        labels: kept.labels,
        annotations: trigger,
        resource_version: kept.resource_version,
        ..ObjectMeta::default()
    })
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

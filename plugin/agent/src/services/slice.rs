//! An EndpointSlice as the agent keeps it: what kube-proxy reads of one,
//! decoded straight from the API server's JSON (the rest skipped, never
//! held), in a store of the agent's own (`policy::object_store`).
//! k8s-openapi's keeps each endpoint's `targetRef` (seven strings),
//! hostname and deprecated topology besides: 6.3 KB a slice of ten
//! endpoints at the scale harness's xl size, 63 MB in all; with its
//! metadata's label and annotation maps (a B-tree node each) and a kube
//! reflector store's key, 3.2 KB. Of the metadata only what is read is
//! kept: the Service it serves, whether it is another proxy's, the
//! change's trigger time. The small types (conditions, hints, ports) are
//! k8s-openapi's; addresses are parsed, names shared (`interned`).

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use super::{SERVICE_NAME_LABEL, not_for_this_proxy};
use crate::policy::object_store::{Named, Watched};
use crate::slim::{ServedMetadata, watched_as};

/// An EndpointSlice (discovery.k8s.io/v1), slim.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Served")]
pub struct EndpointSlice {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// Its `kubernetes.io/service-name` label: the Service it serves.
    pub service_name: Option<Arc<str>>,
    /// Labelled headless or another proxy's: kube-proxy's informers select
    /// it away, and so does flatnet.
    pub not_for_this_proxy: bool,
    /// `endpoints.kubernetes.io/last-change-trigger-time`.
    pub trigger_time: Option<Box<str>>,
    pub address_type: Arc<str>,
    pub endpoints: Option<Vec<Endpoint>>,
    pub ports: Option<Vec<EndpointPort>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Endpoint {
    /// Parsed; one that does not parse is left out (kube-proxy's too).
    #[serde(deserialize_with = "parsed_addresses")]
    pub addresses: Vec<IpAddr>,
    pub conditions: Option<EndpointConditions>,
    /// Boxed: most endpoints have none, and the box is 40 bytes less
    /// than the two lists inline, per endpoint.
    pub hints: Option<Box<EndpointHints>>,
    #[serde(deserialize_with = "shared_node_name")]
    pub node_name: Option<Arc<str>>,
}

fn parsed_addresses<'de, D: Deserializer<'de>>(decoder: D) -> Result<Vec<IpAddr>, D::Error> {
    let served = Vec::<String>::deserialize(decoder)?;
    Ok(served.iter().filter_map(|a| a.parse().ok()).collect())
}

fn shared_node_name<'de, D: Deserializer<'de>>(decoder: D) -> Result<Option<Arc<str>>, D::Error> {
    let served = Option::<String>::deserialize(decoder)?;
    Ok(served.map(|name| crate::interned::name(&name)))
}

/// An EndpointSlice as kube's watcher decodes it: the slim
/// [`EndpointSlice`], and the metadata the watcher reads (the
/// resourceVersion it resumes from).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Served")]
pub struct WatchedEndpointSlice {
    pub metadata: ObjectMeta,
    pub slice: EndpointSlice,
}

/// An EndpointSlice as served, with only the fields kept.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Served {
    metadata: ServedMetadata,
    address_type: String,
    endpoints: Option<Vec<Endpoint>>,
    ports: Option<Vec<EndpointPort>>,
}

impl From<Served> for WatchedEndpointSlice {
    fn from(mut served: Served) -> Self {
        WatchedEndpointSlice {
            metadata: served.metadata.for_watcher(),
            slice: EndpointSlice::from(served),
        }
    }
}

impl From<Served> for EndpointSlice {
    fn from(served: Served) -> Self {
        let mut meta = served.metadata;
        let (namespace, name) = meta.key();
        EndpointSlice {
            namespace,
            name,
            service_name: meta
                .labels
                .get(SERVICE_NAME_LABEL)
                .map(|s| crate::interned::name(s)),
            not_for_this_proxy: not_for_this_proxy(&meta.labels),
            trigger_time: meta.trigger_time(),
            address_type: crate::interned::name(&served.address_type),
            endpoints: served.endpoints,
            ports: served.ports,
        }
    }
}

impl Named for EndpointSlice {
    fn namespace(&self) -> &Arc<str> {
        &self.namespace
    }

    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn trigger_time(&self) -> Option<&str> {
        self.trigger_time.as_deref()
    }

    fn serves(&self) -> Option<&str> {
        self.service_name.as_deref()
    }
}

impl Watched for WatchedEndpointSlice {
    type Object = EndpointSlice;

    fn object(&self) -> &EndpointSlice {
        &self.slice
    }
}

impl From<WatchedEndpointSlice> for EndpointSlice {
    fn from(watched: WatchedEndpointSlice) -> Self {
        watched.slice
    }
}

watched_as!(
    WatchedEndpointSlice,
    k8s_openapi::api::discovery::v1::EndpointSlice
);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::metrics::latency::TRIGGER_TIME;

    use super::*;

    /// An EndpointSlice as the EndpointSlice controller writes one.
    fn served() -> serde_json::Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": "web-abc", "namespace": "shop", "resourceVersion": "17", "uid": "u",
                "labels": {"kubernetes.io/service-name": "web"},
                "annotations": {TRIGGER_TIME: "2026-11-30T10:00:00Z", "other": "x"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "s"}],
                "managedFields": [{"manager": "kube-controller-manager"}]
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.1.5"], "conditions": {"ready": true, "serving": true, "terminating": false},
                 "nodeName": "node-1", "zone": "a", "hostname": "web-1",
                 "hints": {"forZones": [{"name": "a"}], "forNodes": [{"name": "node-1"}]},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "p"}},
                {"addresses": ["not-an-address", "10.0.1.6"], "nodeName": "node-1"}
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}]
        })
    }

    #[test]
    fn keeps_what_services_read_and_nothing_else() {
        let watched: WatchedEndpointSlice = serde_json::from_value(served()).unwrap();
        let meta = &watched.metadata;
        assert_eq!(meta.resource_version.as_deref(), Some("17"));
        assert!(meta.labels.is_none() && meta.annotations.is_none() && meta.uid.is_none());
        let slice = watched.slice;
        assert_eq!((&*slice.namespace, &*slice.name), ("shop", "web-abc"));
        assert_eq!(slice.service_name.as_deref(), Some("web"));
        assert!(!slice.not_for_this_proxy);
        assert_eq!(slice.trigger_time.as_deref(), Some("2026-11-30T10:00:00Z"));
        assert_eq!(&*slice.address_type, "IPv4");
        let endpoints = slice.endpoints.as_ref().unwrap();
        assert_eq!(
            endpoints[0].addresses,
            ["10.0.1.5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(endpoints[0].conditions.as_ref().unwrap().ready, Some(true));
        let hints = endpoints[0].hints.as_ref().unwrap();
        assert_eq!(hints.for_nodes.as_ref().unwrap()[0].name, "node-1");
        assert_eq!(hints.for_zones.as_ref().unwrap()[0].name, "a");
        assert_eq!(
            endpoints[1].addresses,
            ["10.0.1.6".parse::<IpAddr>().unwrap()]
        );
        let (a, b) = (&endpoints[0].node_name, &endpoints[1].node_name);
        assert!(Arc::ptr_eq(a.as_ref().unwrap(), b.as_ref().unwrap()));
        assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(8080));
    }

    #[test]
    fn is_watched_as_discovery_v1_endpoint_slices() {
        use kube::Resource;
        assert_eq!(WatchedEndpointSlice::kind(&()), "EndpointSlice");
        assert_eq!(
            WatchedEndpointSlice::api_version(&()),
            "discovery.k8s.io/v1"
        );
        assert_eq!(
            WatchedEndpointSlice::url_path(&(), Some("ns")),
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
        );
    }
}

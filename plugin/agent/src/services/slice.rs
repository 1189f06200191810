//! An EndpointSlice as the agent keeps it: what kube-proxy reads of one,
//! decoded straight from the API server's JSON (the rest skipped, never
//! held). k8s-openapi's keeps each endpoint's `targetRef` (seven strings),
//! hostname and deprecated topology besides: 6.3 KB a slice of ten
//! endpoints at the scale harness's xl size, 63 MB in all. Field names and
//! the small types (conditions, hints, ports) are k8s-openapi's, so code
//! reads it alike; addresses are parsed, node names shared (`interned`).

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use crate::interned::Interner;
use crate::slim::{kept_metadata, watched_as};

static NODE_NAMES: LazyLock<Interner<str>> = LazyLock::new(Interner::new);

/// An EndpointSlice (discovery.k8s.io/v1), slim.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointSlice {
    /// Name, namespace, labels, resourceVersion (until the store), and of
    /// the annotations only the change's trigger time.
    #[serde(deserialize_with = "kept_metadata")]
    pub metadata: ObjectMeta,
    pub address_type: String,
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
    pub hints: Option<EndpointHints>,
    #[serde(deserialize_with = "shared_node_name")]
    pub node_name: Option<Arc<str>>,
}

fn parsed_addresses<'de, D: Deserializer<'de>>(decoder: D) -> Result<Vec<IpAddr>, D::Error> {
    let served = Vec::<String>::deserialize(decoder)?;
    Ok(served.iter().filter_map(|a| a.parse().ok()).collect())
}

fn shared_node_name<'de, D: Deserializer<'de>>(decoder: D) -> Result<Option<Arc<str>>, D::Error> {
    let served = Option::<String>::deserialize(decoder)?;
    Ok(served.map(|name| NODE_NAMES.text(&name)))
}

watched_as!(
    EndpointSlice,
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
        let slice: EndpointSlice = serde_json::from_value(served()).unwrap();
        let meta = &slice.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-abc"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(
            meta.labels.as_ref().unwrap()["kubernetes.io/service-name"],
            "web"
        );
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), [TRIGGER_TIME]);
        assert!(meta.owner_references.is_none() && meta.uid.is_none());
        assert_eq!(slice.address_type, "IPv4");
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
        assert_eq!(EndpointSlice::kind(&()), "EndpointSlice");
        assert_eq!(EndpointSlice::api_version(&()), "discovery.k8s.io/v1");
        assert_eq!(
            EndpointSlice::url_path(&(), Some("ns")),
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
        );
    }
}

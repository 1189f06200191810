//! The Kubernetes peer source: Node objects through a list-then-watch
//! (kube's watcher, which re-lists after a broken watch and backs off on
//! errors). A node's pod CIDRs are `spec.podCIDRs` (or the older
//! `spec.podCIDR`), its address the `InternalIP`s of `status.addresses`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use crate::error::Result;
use crate::peers::{Node, PeerSource};

type NodeEvents =
    Pin<Box<dyn Stream<Item = std::result::Result<Event<KubeNode>, watcher::Error>> + Send>>;

/// Nodes from the API server.
pub struct KubeSource {
    events: NodeEvents,
    /// Every node seen, by name, as of the last complete list plus events.
    nodes: BTreeMap<String, Node>,
    /// A re-list in progress: the nodes it has listed so far.
    listing: Option<BTreeMap<String, Node>>,
    /// The view handed out last; None before the first complete list.
    reported: Option<Vec<Node>>,
}

impl KubeSource {
    /// Watches every Node with `client` (only get/list/watch on nodes needed).
    pub fn new(client: Client) -> Self {
        let api: Api<KubeNode> = Api::all(client);
        let events = crate::watch_backoff::backed_off(
            watcher::watcher(api, watcher::Config::default()),
            false,
        );
        KubeSource {
            events: Box::pin(events),
            nodes: BTreeMap::new(),
            listing: None,
            reported: None,
        }
    }

    /// A client from the usual places, in kube's `Config::infer` order:
    /// KUBECONFIG or ~/.kube/config when there is one, else the in-cluster
    /// service account.
    pub async fn connect() -> Result<Self> {
        Ok(Self::new(client(None).await?))
    }

    /// A client for an API server URL that needs no credentials, such as
    /// `kubectl proxy` (http://127.0.0.1:8001) or a test's stub.
    pub fn for_api_server(url: &str) -> Result<Self> {
        Ok(Self::new(client_for(url)?))
    }
}

/// The API client: for `api_server` (a URL needing no credentials), else
/// from KUBECONFIG or ~/.kube/config, else in-cluster. One client serves
/// every watch of the agent.
pub async fn client(api_server: Option<&str>) -> Result<Client> {
    match api_server {
        Some(url) => client_for(url),
        None => Ok(Client::try_from(kube::Config::infer().await?)?),
    }
}

fn client_for(url: &str) -> Result<Client> {
    let uri = url
        .parse()
        .map_err(|e| crate::error::AgentError::Config(format!("--kube-api-server {url}: {e}")))?;
    Ok(Client::try_from(kube::Config::new(uri))?)
}

impl KubeSource {
    /// Applies one event; true when a complete view is available.
    fn apply(&mut self, event: Event<KubeNode>) -> bool {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::InitApply(object) => {
                if let (Some(listing), Some(node)) = (self.listing.as_mut(), convert(&object)) {
                    listing.insert(node.name.clone(), node);
                }
                false
            }
            Event::InitDone => {
                // A re-list replaces everything: nodes deleted while no
                // watch was running vanish here.
                if let Some(listing) = self.listing.take() {
                    self.nodes = listing;
                }
                true
            }
            Event::Apply(object) => {
                if let Some(node) = convert(&object) {
                    self.nodes.insert(node.name.clone(), node);
                }
                self.reported.is_some()
            }
            Event::Delete(object) => {
                if let Some(name) = object.metadata.name.as_deref() {
                    self.nodes.remove(name);
                }
                self.reported.is_some()
            }
        }
    }
}

impl PeerSource for KubeSource {
    async fn changed(&mut self) -> Result<Vec<Node>> {
        loop {
            let Some(event) = self.events.next().await else {
                return Err(crate::error::AgentError::SourceEnded(
                    "the Node watch stream closed".into(),
                ));
            };
            if self.apply(event?) {
                let view: Vec<Node> = self.nodes.values().cloned().collect();
                if self.reported.as_ref() != Some(&view) {
                    self.reported = Some(view.clone());
                    return Ok(view);
                }
            }
        }
    }
}

/// The well-known label of a node's zone.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The parts of a Node object pod networking needs; None without a name.
pub fn convert(object: &KubeNode) -> Option<Node> {
    let name = object.metadata.name.clone()?;
    let spec = object.spec.as_ref();
    let mut texts: Vec<&str> = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .map(|cidrs| cidrs.iter().map(String::as_str).collect())
        .unwrap_or_default();
    if texts.is_empty()
        && let Some(single) = spec.and_then(|s| s.pod_cidr.as_deref())
    {
        texts.push(single);
    }
    let pod_cidrs: Vec<IpNetwork> = texts
        .into_iter()
        .filter_map(|text| match text.parse() {
            Ok(cidr) => Some(cidr),
            Err(e) => {
                tracing::warn!(node = %name, cidr = text, error = %e, "ignoring an unparsable pod CIDR");
                None
            }
        })
        .collect();
    let addresses: Vec<IpAddr> = object
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|addresses| {
            addresses
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let zone = object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(ZONE_LABEL))
        .cloned();
    Some(Node {
        name,
        addresses,
        pod_cidrs,
        zone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> KubeNode {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn cidrs_and_internal_addresses_are_taken_from_the_node() {
        let n = convert(&node(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "worker-1", "labels": {"topology.kubernetes.io/zone": "zone-b"}},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd10:1::/64"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "worker-1"},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "InternalIP", "address": "192.168.1.11"},
                {"type": "InternalIP", "address": "fd00::11"}
            ]}
        })))
        .unwrap();
        assert_eq!(n.name, "worker-1");
        assert_eq!(n.pod_cidrs.len(), 2);
        assert_eq!(
            n.addresses,
            [
                "192.168.1.11".parse::<IpAddr>().unwrap(),
                "fd00::11".parse().unwrap()
            ]
        );
        assert_eq!(n.zone.as_deref(), Some("zone-b"));
    }

    #[test]
    fn the_single_pod_cidr_field_and_missing_parts_are_handled() {
        let n = convert(&node(serde_json::json!({
            "metadata": {"name": "old"}, "spec": {"podCIDR": "10.244.9.0/24"}
        })))
        .unwrap();
        assert_eq!(n.pod_cidrs, ["10.244.9.0/24".parse().unwrap()]);
        assert!(n.addresses.is_empty());
        let fresh = convert(&node(serde_json::json!({"metadata": {"name": "new"}}))).unwrap();
        assert!(fresh.pod_cidrs.is_empty());
        assert!(convert(&node(serde_json::json!({"metadata": {}}))).is_none());
    }
}

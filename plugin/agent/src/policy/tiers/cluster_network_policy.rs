//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1beta1`, the CRDs of
//! `sigs.k8s.io/network-policy-api` v0.3.0; `v1alpha2` is served with the
//! same schema) in the agent's own form: what the evaluation reads, the
//! selectors shared with NetworkPolicy's ([`LabelSelector`]).
//!
//! A part the agent does not implement or does not know (`domainNames`, a
//! peer or protocol with no field it knows: a newer CRD) is kept as
//! [`Peer::Unsupported`] or [`Ports::Unsupported`], and the rule holding it
//! fails closed as the API asks: an `Accept` rule matches nothing, a `Deny`
//! or `Pass` rule denies all the traffic of its direction.

use std::sync::{Arc, LazyLock};

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use serde::Deserialize;

use crate::policy::network_policy::{LabelSelector, shared_selector};
use crate::policy::object_store::{Named, Watched};
use crate::protocol::Protocol;

/// Where a policy sits: before NetworkPolicy, or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum Tier {
    Admin,
    Baseline,
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Action {
    Accept,
    Deny,
    /// On to the next tier (after Admin: NetworkPolicy; after Baseline:
    /// the default, which accepts).
    Pass,
}

/// A ClusterNetworkPolicy as the agent keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "Served")]
pub struct ClusterNetworkPolicy {
    pub name: Arc<str>,
    pub tier: Tier,
    /// 0 to 1000; lower goes first within the tier.
    pub priority: u16,
    pub subject: Subject,
    pub ingress: Box<[Rule]>,
    pub egress: Box<[Rule]>,
}

/// The pods a policy applies to (never host-network ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// Every pod of the namespaces selected.
    Namespaces(LabelSelector),
    Pods(NamespacedPods),
    /// No field the agent knows: the policy applies to no pod (its rules
    /// could not say what they mean).
    Unsupported,
}

/// Pods selected by their namespace's labels and their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacedPods {
    pub namespaces: LabelSelector,
    pub pods: LabelSelector,
}

/// One ingress or egress rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: Box<str>,
    pub action: Action,
    /// Any of them (`from` or `to`).
    pub peers: Box<[Peer]>,
    /// Any of them; none given matches every protocol and port (ICMP too).
    pub protocols: Box<[Ports]>,
}

impl Rule {
    /// Whether something in it is not understood (the rule fails closed).
    pub fn has_unsupported(&self) -> bool {
        self.peers.iter().any(|p| matches!(p, Peer::Unsupported(_)))
            || self
                .protocols
                .iter()
                .any(|p| matches!(p, Ports::Unsupported(_)))
    }
}

/// The other end of the traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    Namespaces(LabelSelector),
    Pods(NamespacedPods),
    /// The addresses of the nodes selected (egress only).
    Nodes(LabelSelector),
    /// Addresses in these CIDRs, pods' included.
    Networks(Box<[IpNetwork]>),
    /// What is not implemented or not known, by name.
    Unsupported(Box<str>),
}

/// Destination ports a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// `first..=last` of one protocol.
    Range {
        protocol: Protocol,
        first: u16,
        last: u16,
    },
    /// The destination pod's container port of this name.
    Named(Box<str>),
    Unsupported(Box<str>),
}

/// A ClusterNetworkPolicy as kube's watcher decodes it: the agent's form,
/// and the metadata the watcher reads (the resourceVersion it resumes
/// from).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "Served")]
pub struct WatchedClusterNetworkPolicy {
    pub metadata: meta::ObjectMeta,
    pub policy: ClusterNetworkPolicy,
}

impl From<Served> for WatchedClusterNetworkPolicy {
    fn from(mut served: Served) -> Self {
        let metadata = meta::ObjectMeta {
            name: served.metadata.name.clone(),
            resource_version: served.metadata.resource_version.take(),
            ..meta::ObjectMeta::default()
        };
        WatchedClusterNetworkPolicy {
            metadata,
            policy: served.into(),
        }
    }
}

impl From<WatchedClusterNetworkPolicy> for ClusterNetworkPolicy {
    fn from(watched: WatchedClusterNetworkPolicy) -> Self {
        watched.policy
    }
}

impl Watched for WatchedClusterNetworkPolicy {
    type Object = ClusterNetworkPolicy;

    fn object(&self) -> &ClusterNetworkPolicy {
        &self.policy
    }
}

/// Cluster-scoped: the store keeps every policy under one empty namespace.
static NO_NAMESPACE: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));

impl Named for ClusterNetworkPolicy {
    fn namespace(&self) -> &Arc<str> {
        &NO_NAMESPACE
    }

    fn name(&self) -> &Arc<str> {
        &self.name
    }
}

/// The CRD's storage version (`v1alpha2` is served too, with the same
/// schema; either reads the same objects).
impl k8s_openapi::Resource for WatchedClusterNetworkPolicy {
    const API_VERSION: &'static str = "policy.networking.k8s.io/v1beta1";
    const GROUP: &'static str = "policy.networking.k8s.io";
    const KIND: &'static str = "ClusterNetworkPolicy";
    const VERSION: &'static str = "v1beta1";
    const URL_PATH_SEGMENT: &'static str = "clusternetworkpolicies";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for WatchedClusterNetworkPolicy {
    type Ty = meta::ObjectMeta;

    fn metadata(&self) -> &meta::ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut meta::ObjectMeta {
        &mut self.metadata
    }
}

// What the API serves, under its names.

#[derive(Deserialize)]
struct Served {
    metadata: meta::ObjectMeta,
    spec: ServedSpec,
}

#[derive(Deserialize)]
struct ServedSpec {
    tier: Tier,
    priority: i32,
    subject: ServedSubject,
    #[serde(default)]
    ingress: Vec<ServedRule>,
    #[serde(default)]
    egress: Vec<ServedRule>,
}

#[derive(Deserialize)]
struct ServedSubject {
    namespaces: Option<meta::LabelSelector>,
    pods: Option<ServedPods>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServedPods {
    #[serde(default)]
    namespace_selector: meta::LabelSelector,
    #[serde(default)]
    pod_selector: meta::LabelSelector,
}

/// An ingress rule's `from` or an egress rule's `to`, both read here.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServedRule {
    #[serde(default)]
    name: String,
    action: Action,
    #[serde(default, alias = "to")]
    from: Vec<ServedPeer>,
    #[serde(default)]
    protocols: Vec<ServedProtocol>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServedPeer {
    namespaces: Option<meta::LabelSelector>,
    pods: Option<ServedPods>,
    nodes: Option<meta::LabelSelector>,
    networks: Option<Vec<String>>,
    domain_names: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServedProtocol {
    tcp: Option<ServedPort>,
    udp: Option<ServedPort>,
    sctp: Option<ServedPort>,
    destination_named_port: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServedPort {
    destination_port: Option<ServedPortValue>,
}

#[derive(Deserialize)]
struct ServedPortValue {
    number: Option<i32>,
    range: Option<ServedRange>,
}

#[derive(Deserialize)]
struct ServedRange {
    start: i32,
    end: i32,
}

impl From<Served> for ClusterNetworkPolicy {
    fn from(served: Served) -> Self {
        let spec = served.spec;
        let rules = |rules: Vec<ServedRule>| rules.into_iter().map(rule).collect();
        ClusterNetworkPolicy {
            name: served.metadata.name.unwrap_or_default().into(),
            tier: spec.tier,
            // The API server keeps it to 0..=1000.
            priority: spec.priority.clamp(0, 1000) as u16,
            subject: match (spec.subject.namespaces, spec.subject.pods) {
                (Some(namespaces), None) => Subject::Namespaces(shared_selector(namespaces)),
                (None, Some(pods)) => Subject::Pods(namespaced(pods)),
                _ => Subject::Unsupported,
            },
            ingress: rules(spec.ingress),
            egress: rules(spec.egress),
        }
    }
}

fn namespaced(pods: ServedPods) -> NamespacedPods {
    NamespacedPods {
        namespaces: shared_selector(pods.namespace_selector),
        pods: shared_selector(pods.pod_selector),
    }
}

fn rule(served: ServedRule) -> Rule {
    Rule {
        name: served.name.into(),
        action: served.action,
        peers: served.from.into_iter().map(peer).collect(),
        protocols: served.protocols.into_iter().map(ports).collect(),
    }
}

/// Exactly one field set, else unsupported (the CRD allows one).
fn peer(served: ServedPeer) -> Peer {
    let ServedPeer {
        namespaces,
        pods,
        nodes,
        networks,
        domain_names,
    } = served;
    match (namespaces, pods, nodes, networks, domain_names) {
        (Some(namespaces), None, None, None, None) => Peer::Namespaces(shared_selector(namespaces)),
        (None, Some(pods), None, None, None) => Peer::Pods(namespaced(pods)),
        (None, None, Some(nodes), None, None) => Peer::Nodes(shared_selector(nodes)),
        (None, None, None, Some(networks), None) => {
            let parsed: Result<Box<[IpNetwork]>, _> =
                networks.iter().map(|n| n.parse::<IpNetwork>()).collect();
            match parsed {
                Ok(parsed) => Peer::Networks(parsed),
                Err(_) => Peer::Unsupported(format!("networks {networks:?}").into()),
            }
        }
        (None, None, None, None, Some(_)) => Peer::Unsupported("domainNames".into()),
        _ => Peer::Unsupported("a peer with no single field known".into()),
    }
}

fn ports(served: ServedProtocol) -> Ports {
    let ServedProtocol {
        tcp,
        udp,
        sctp,
        destination_named_port,
    } = served;
    let range = |protocol, port: ServedPort| match port.destination_port {
        None => Ports::Range {
            protocol,
            first: 0,
            last: u16::MAX,
        },
        Some(ServedPortValue {
            number: Some(number),
            range: None,
        }) => match u16::try_from(number) {
            Ok(port) => Ports::Range {
                protocol,
                first: port,
                last: port,
            },
            Err(_) => Ports::Unsupported(format!("port {number}").into()),
        },
        Some(ServedPortValue {
            number: None,
            range: Some(ServedRange { start, end }),
        }) => match (u16::try_from(start), u16::try_from(end)) {
            (Ok(first), Ok(last)) if first <= last => Ports::Range {
                protocol,
                first,
                last,
            },
            _ => Ports::Unsupported(format!("port range {start}-{end}").into()),
        },
        Some(_) => Ports::Unsupported("a port with no single field known".into()),
    };
    match (tcp, udp, sctp, destination_named_port) {
        (Some(port), None, None, None) => range(Protocol::Tcp, port),
        (None, Some(port), None, None) => range(Protocol::Udp, port),
        (None, None, Some(port), None) => range(Protocol::Sctp, port),
        (None, None, None, Some(name)) => Ports::Named(name.into()),
        _ => Ports::Unsupported("a protocol with no single field known".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_api_serves_is_read_under_its_names() {
        let policy: ClusterNetworkPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy.networking.k8s.io/v1beta1",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "monitoring"},
            "spec": {
                "tier": "Admin", "priority": 10,
                "subject": {"namespaces": {"matchLabels": {"team": "monitoring"}}},
                "ingress": [
                    {"name": "prometheus", "action": "Accept",
                     "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}}],
                     "protocols": [{"tcp": {"destinationPort": {"number": 9090}}},
                                   {"udp": {"destinationPort": {"range": {"start": 8000, "end": 8100}}}},
                                   {"destinationNamedPort": "metrics"}]},
                    {"action": "Deny", "from": [{"namespaces": {}}]}
                ],
                "egress": [
                    {"action": "Pass", "to": [{"networks": ["10.0.0.0/8", "fd00::/8"]}]},
                    {"action": "Deny", "to": [{"nodes": {}}]},
                    {"action": "Accept", "to": [{"domainNames": ["kubernetes.io"]}]}
                ]
            }
        }))
        .unwrap();
        assert_eq!(&*policy.name, "monitoring");
        assert_eq!((policy.tier, policy.priority), (Tier::Admin, 10));
        assert!(matches!(policy.subject, Subject::Namespaces(_)));
        assert_eq!(policy.ingress.len(), 2);
        let first = &policy.ingress[0];
        assert_eq!((&*first.name, first.action), ("prometheus", Action::Accept));
        assert!(matches!(first.peers[0], Peer::Pods(_)));
        assert_eq!(
            first.protocols[..],
            [
                Ports::Range {
                    protocol: Protocol::Tcp,
                    first: 9090,
                    last: 9090
                },
                Ports::Range {
                    protocol: Protocol::Udp,
                    first: 8000,
                    last: 8100
                },
                Ports::Named("metrics".into()),
            ]
        );
        assert!(!first.has_unsupported());
        assert_eq!(policy.egress[0].action, Action::Pass);
        assert!(
            matches!(&policy.egress[0].peers[0], Peer::Networks(n) if n.len() == 2),
            "{:?}",
            policy.egress[0]
        );
        assert!(matches!(policy.egress[1].peers[0], Peer::Nodes(_)));
        assert!(policy.egress[2].has_unsupported(), "domainNames");
    }

    #[test]
    fn what_cannot_be_read_fails_closed() {
        let policy: ClusterNetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "newer"},
            "spec": {
                "tier": "Baseline", "priority": 0,
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {}}},
                "ingress": [
                    {"action": "Deny", "from": [{"services": {}}]},
                    {"action": "Accept", "from": [{"networks": ["10.0.0.0/33"]}]},
                    {"action": "Accept", "from": [{"namespaces": {}}],
                     "protocols": [{"tcp": {"destinationPort": {"range": {"start": 90, "end": 80}}}}]}
                ]
            }
        }))
        .unwrap();
        assert!(matches!(policy.subject, Subject::Pods(_)));
        assert!(policy.ingress.iter().all(Rule::has_unsupported));
        assert!(policy.egress.is_empty());
    }
}

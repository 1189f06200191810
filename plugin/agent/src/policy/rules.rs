//! From Kubernetes objects to what one pod's policies allow: peers resolved
//! to addresses, ports resolved to numbers, as [`Allow`]s per direction.

use super::network_policy::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, PolicyType};
use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::cluster::{Cluster, PodView};
use super::ports::{PortRange, PortSet};
use super::selector::matches;
use super::table::{Allow, PeerAllow, everywhere};
use crate::protocol::Protocol;

/// Where a rule's traffic may go or come from.
enum Peer {
    /// `from`/`to` missing or empty: every address.
    All,
    Block {
        cidr: IpNetwork,
        except: Vec<IpNetwork>,
    },
    /// The pods of one identity (an index into [`Cluster::identities`]),
    /// those of its members (indices into [`Cluster::peers`]) the peer
    /// selects.
    Identity { index: usize, members: Vec<usize> },
}

/// What rules allow: by address block, and by peer identity.
#[derive(Debug, Default)]
pub struct Allows<'a> {
    pub cidrs: Vec<Allow<'a>>,
    pub peers: Vec<PeerAllow<'a>>,
}

impl<'a> Allows<'a> {
    fn everywhere(&mut self, ports: &PortSet, policy: &'a str) {
        self.cidrs.extend(everywhere().map(|cidr| Allow {
            cidr,
            except: Vec::new(),
            ports: ports.clone(),
            policy,
        }));
    }

    fn identity(&mut self, identity: u32, ports: PortSet, policy: &'a str) {
        if !ports.is_none() {
            self.peers.push(PeerAllow {
                identity,
                ports,
                policy,
            });
        }
    }
}

enum RulePort<'a> {
    Any,
    Numbered(PortRange),
    /// Resolved against the destination pod's container ports.
    Named {
        protocol: Protocol,
        name: &'a str,
    },
}

struct Rule<'a> {
    peers: Vec<Peer>,
    /// Empty when every listed port was invalid: the rule allows nothing.
    ports: Vec<RulePort<'a>>,
}

/// The directions `policy` isolates the pods it selects in: (ingress,
/// egress). Upstream defaulting: unset (or empty) policyTypes means
/// Ingress, plus Egress when there are egress rules.
pub fn policy_types(policy: &NetworkPolicy) -> (bool, bool) {
    let spec = policy.spec.as_ref();
    let types = spec
        .and_then(|s| s.policy_types.as_deref())
        .unwrap_or_default();
    if types.is_empty() {
        let egress_rules = spec.and_then(|s| s.egress.as_deref()).unwrap_or_default();
        (true, !egress_rules.is_empty())
    } else {
        (
            types.contains(&PolicyType::Ingress),
            types.contains(&PolicyType::Egress),
        )
    }
}

/// A policy with its peers resolved, for the pods it selects.
pub struct Policy<'a> {
    pub name: &'a str,
    /// Some when the policy's types include Ingress.
    ingress: Option<Vec<Rule<'a>>>,
    egress: Option<Vec<Rule<'a>>>,
}

impl<'a> Policy<'a> {
    /// A missing spec reads as Go's zero value: all pods, Ingress, no rules.
    pub fn compile(policy: &'a NetworkPolicy, cluster: &Cluster<'a>) -> Self {
        let namespace = &*policy.namespace;
        let spec = policy.spec.as_ref();
        let ingress_rules = spec.and_then(|s| s.ingress.as_deref()).unwrap_or_default();
        let egress_rules = spec.and_then(|s| s.egress.as_deref()).unwrap_or_default();
        let (has_ingress, has_egress) = policy_types(policy);
        let compile = |peers: Option<&'a [NetworkPolicyPeer]>,
                       ports: Option<&'a [NetworkPolicyPort]>| Rule {
            peers: compile_peers(peers, namespace, cluster),
            ports: compile_ports(ports),
        };
        Policy {
            name: &policy.name,
            ingress: has_ingress.then(|| {
                let rules = ingress_rules.iter();
                rules
                    .map(|r| compile(r.from.as_deref(), r.ports.as_deref()))
                    .collect()
            }),
            egress: has_egress.then(|| {
                let rules = egress_rules.iter();
                rules
                    .map(|r| compile(r.to.as_deref(), r.ports.as_deref()))
                    .collect()
            }),
        }
    }

    pub fn isolates_ingress(&self) -> bool {
        self.ingress.is_some()
    }

    pub fn isolates_egress(&self) -> bool {
        self.egress.is_some()
    }

    /// What this policy's ingress rules let into `subject`. Named ports
    /// are the subject's own: it is the destination.
    pub fn ingress_allows(
        &self,
        subject: &PodView<'_>,
        cluster: &Cluster<'a>,
        out: &mut Allows<'a>,
    ) {
        for rule in self.ingress.iter().flatten() {
            let ports = PortSet::union(
                &rule
                    .ports
                    .iter()
                    .map(|p| resolve(p, Some(subject)))
                    .collect::<Vec<_>>(),
            );
            if ports.is_none() {
                continue;
            }
            for peer in &rule.peers {
                match peer {
                    Peer::All => out.everywhere(&ports, self.name),
                    Peer::Block { cidr, except } => out.cidrs.push(Allow {
                        cidr: *cidr,
                        except: except.clone(),
                        ports: ports.clone(),
                        policy: self.name,
                    }),
                    Peer::Identity { index, .. } => {
                        let number = cluster.identities[*index].number;
                        out.identity(number, ports.clone(), self.name);
                    }
                }
            }
        }
    }

    /// What this policy's egress rules let out of its pods (the same for
    /// each of them). Named ports are each destination pod's: such a rule
    /// becomes one entry per identity whose pods have the port, and never
    /// matches an ipBlock (upstream: a named port only means something on a
    /// pod).
    pub fn egress_allows(&self, cluster: &Cluster<'a>, out: &mut Allows<'a>) {
        for rule in self.egress.iter().flatten() {
            // Without a destination pod, named ports resolve to nothing.
            let numbered: Vec<PortSet> = rule.ports.iter().map(|p| resolve(p, None)).collect();
            let numbered = PortSet::union(&numbered);
            let named: Vec<&RulePort<'a>> = rule
                .ports
                .iter()
                .filter(|p| matches!(p, RulePort::Named { .. }))
                .collect();
            // Members of one identity show the same named ports.
            let per_member = |members: &[usize], with_numbered: bool| {
                let pods = members.iter().map(|&m| &cluster.peers[m]);
                let resolved: Vec<PortSet> = pods
                    .flat_map(|pod| named.iter().map(|p| resolve(p, Some(pod))))
                    .collect();
                let numbered = with_numbered.then_some(&numbered);
                PortSet::union(resolved.iter().chain(numbered))
            };
            for peer in &rule.peers {
                match peer {
                    Peer::All => {
                        if !numbered.is_none() {
                            out.everywhere(&numbered, self.name);
                        }
                        // Numbered ports are everywhere's already: an
                        // identity needs an entry only where a name
                        // resolves.
                        if !named.is_empty() {
                            for identity in &cluster.identities {
                                if !per_member(&identity.members, false).is_none() {
                                    let ports = per_member(&identity.members, true);
                                    out.identity(identity.number, ports, self.name);
                                }
                            }
                        }
                    }
                    Peer::Block { cidr, except } if !numbered.is_none() => out.cidrs.push(Allow {
                        cidr: *cidr,
                        except: except.clone(),
                        ports: numbered.clone(),
                        policy: self.name,
                    }),
                    Peer::Block { .. } => {}
                    Peer::Identity { index, members } => {
                        let number = cluster.identities[*index].number;
                        out.identity(number, per_member(members, true), self.name);
                    }
                }
            }
        }
    }
}

/// Whether `policy` selects `pod`: same namespace, and its pod selector
/// matches (a missing one, like the empty one, selects every pod).
pub fn selects(policy: &NetworkPolicy, pod: &PodView<'_>) -> bool {
    selects_labels(policy, pod.namespace, pod.labels)
}

/// [`selects`] for a pod in `namespace` labelled `labels`.
pub fn selects_labels(
    policy: &NetworkPolicy,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    *policy.namespace == *namespace
        && policy
            .spec
            .as_ref()
            .and_then(|s| s.pod_selector.as_ref())
            .is_none_or(|s| matches(s, labels))
}

/// A rule's `from`/`to`. Missing or empty: everything. A peer the API
/// server would reject (unparsable CIDR or except, or no selector and no
/// ipBlock) matches nothing: dropping an except would allow more.
fn compile_peers(
    peers: Option<&[NetworkPolicyPeer]>,
    namespace: &str,
    cluster: &Cluster<'_>,
) -> Vec<Peer> {
    let peers = peers.unwrap_or_default();
    if peers.is_empty() {
        return vec![Peer::All];
    }
    let mut compiled = Vec::new();
    for peer in peers {
        if let Some(block) = &peer.ip_block {
            let cidr = block.cidr.parse::<IpNetwork>();
            let except: Result<Vec<IpNetwork>, _> = block
                .except
                .iter()
                .flatten()
                .map(|e| e.parse::<IpNetwork>())
                .collect();
            if let (Ok(cidr), Ok(except)) = (cidr, except) {
                compiled.push(Peer::Block { cidr, except });
            }
            continue;
        }
        if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
            continue;
        }
        // namespaceSelector picks the namespaces (else the policy's own),
        // podSelector the pods in them (else all): both given means AND.
        // An identity's members stand for all its pods.
        let selects = |pod: &PodView<'_>| {
            let in_namespace = match &peer.namespace_selector {
                Some(selector) => cluster.namespace_matches(selector, pod.namespace),
                None => pod.namespace == namespace,
            };
            in_namespace
                && peer
                    .pod_selector
                    .as_ref()
                    .is_none_or(|s| matches(s, pod.labels))
        };
        for (index, identity) in cluster.identities.iter().enumerate() {
            let members: Vec<usize> = identity
                .members
                .iter()
                .copied()
                .filter(|&m| selects(&cluster.peers[m]))
                .collect();
            if !members.is_empty() {
                compiled.push(Peer::Identity { index, members });
            }
        }
    }
    compiled
}

/// A rule's `ports`. Missing or empty: all ports of all protocols. A port
/// the API server would reject (unknown protocol, number out of range,
/// endPort below port) is left out, so it allows nothing.
fn compile_ports(ports: Option<&[NetworkPolicyPort]>) -> Vec<RulePort<'_>> {
    let ports = ports.unwrap_or_default();
    if ports.is_empty() {
        return vec![RulePort::Any];
    }
    let number = |n: i32| u16::try_from(n).ok().filter(|&n| n > 0);
    ports
        .iter()
        .filter_map(|p| {
            let protocol = Protocol::from_kube(p.protocol.as_deref())?;
            match &p.port {
                None => Some(RulePort::Numbered(PortRange::all(protocol))),
                Some(IntOrString::Int(port)) => {
                    let first = number(*port)?;
                    let last = match p.end_port {
                        Some(end) => number(end).filter(|&end| end >= first)?,
                        None => first,
                    };
                    Some(RulePort::Numbered(PortRange::new(protocol, first, last)))
                }
                Some(IntOrString::String(name)) => Some(RulePort::Named { protocol, name }),
            }
        })
        .collect()
}

/// The ports `port` stands for on `destination` (a named port needs one).
fn resolve(port: &RulePort<'_>, destination: Option<&PodView<'_>>) -> PortSet {
    match port {
        RulePort::Any => PortSet::Any,
        RulePort::Numbered(range) => PortSet::of([*range]),
        RulePort::Named { protocol, name } => PortSet::of(
            destination
                .into_iter()
                .flat_map(|pod| pod.named_ports(*protocol, name)),
        ),
    }
}

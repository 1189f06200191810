//! The cluster as the agent sees it: nodes with pod CIDRs and addresses,
//! from one of several sources behind [`PeerSource`], and what follows for
//! this node ([`plan`]): its own pod CIDRs and one route per peer CIDR.

pub mod carrier;
mod claimed;
pub mod file_source;
pub mod kube_source;
pub mod routes;
pub mod tunnel;

use std::future::Future;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::error::Result;
pub use carrier::{Carrier, Routing, RoutingMode};
use claimed::Claimed;

/// One node of the cluster, as far as pod networking cares.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    pub name: String,
    /// The node's addresses other nodes reach it at (Kubernetes:
    /// `status.addresses` of type InternalIP), preferred first.
    pub addresses: Vec<IpAddr>,
    /// The pod CIDRs the node owns (`spec.podCIDRs`, one per family); empty
    /// while none is allocated yet.
    pub pod_cidrs: Vec<IpNetwork>,
    /// `topology.kubernetes.io/zone`: Services' topology hints name it.
    pub zone: Option<String>,
}

impl Node {
    /// The node's first address of the family of `cidr`: the next hop for it.
    pub fn address_for(&self, cidr: &IpNetwork) -> Option<IpAddr> {
        self.addresses
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == cidr.is_ipv4())
    }
}

/// Where the agent learns the cluster's nodes. A source yields the complete
/// set of nodes each time it may have changed; the first answer is the
/// initial complete view (never a partial list: routes missing from a
/// partial list would be removed).
pub trait PeerSource: Send + 'static {
    fn changed(&mut self) -> impl Future<Output = Result<Vec<Node>>> + Send;
}

/// A route this node needs: another node's pod CIDR via that node, routed
/// or tunnelled to it (`carrier`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerRoute {
    pub node: String,
    pub cidr: IpNetwork,
    /// The peer's address: the next hop (its address of the CIDR's
    /// family), or the tunnel's far end (its preferred address, whose
    /// family is the underlay's: IPv6 pods may cross an IPv4 underlay).
    pub via: IpAddr,
    pub carrier: Carrier,
}

/// What a route sync did (`routes::Routes::sync`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Routes added or changed (new next hop).
    pub written: Vec<IpNetwork>,
    /// flatnet routes no longer wanted, removed.
    pub removed: Vec<IpNetwork>,
    /// Wanted routes that are in place now (there already, or written):
    /// the only ones the fast path may be told about, since it forwards by
    /// the kernel FIB.
    pub in_place: Vec<PeerRoute>,
    /// Wanted routes that are not in place, with the reason (a route not
    /// made by flatnet in the way, or a failed write).
    pub missing: Vec<String>,
    /// Kernel requests (writes and removals) that failed, with the reason.
    pub failures: Vec<String>,
}

/// What the node list means for this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// This node's entry, if the list has it.
    pub me: Option<Node>,
    /// Routes to the other nodes' pod CIDRs, sorted.
    pub routes: Vec<PeerRoute>,
    /// Peers or CIDRs left out, with the reason (logged).
    pub skipped: Vec<String>,
}

impl Plan {
    /// This node's pod CIDRs (empty until it has one).
    pub fn own_cidrs(&self) -> &[IpNetwork] {
        self.me.as_ref().map_or(&[], |me| me.pod_cidrs.as_slice())
    }
}

/// This node's view of `nodes`: its own entry, and a route per CIDR of every
/// other node that has one and an address of the CIDR's family, carried as
/// `routing` says for that address. A CIDR that overlaps this node's own or
/// an earlier node's (sorted by name) is left out: two routes for one
/// destination would send pods' packets astray.
pub fn plan(nodes: &[Node], me: &str, routing: &Routing) -> Plan {
    let mut plan = Plan {
        me: nodes.iter().find(|n| n.name == me).cloned(),
        ..Plan::default()
    };
    let mut peers: Vec<&Node> = nodes.iter().filter(|n| n.name != me).collect();
    peers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut claimed = Claimed::default();
    for cidr in plan.own_cidrs() {
        claimed.claim(me, *cidr);
    }
    for peer in peers {
        if peer.pod_cidrs.is_empty() {
            plan.skipped
                .push(format!("node {}: no pod CIDR allocated yet", peer.name));
            continue;
        }
        for cidr in &peer.pod_cidrs {
            if let Some((owner, other)) = claimed.overlapping(cidr) {
                plan.skipped.push(format!(
                    "node {}: pod CIDR {cidr} overlaps {other} of node {owner}",
                    peer.name
                ));
                continue;
            }
            let Some(via) = peer.address_for(cidr) else {
                plan.skipped.push(format!(
                    "node {}: no {} address to route {cidr} via",
                    peer.name,
                    if cidr.is_ipv4() { "IPv4" } else { "IPv6" }
                ));
                continue;
            };
            claimed.claim(&peer.name, *cidr);
            let carrier = routing.carrier(via);
            let via = match carrier {
                Carrier::Direct => via,
                Carrier::Vxlan => peer.addresses.first().copied().unwrap_or(via),
            };
            plan.routes.push(PeerRoute {
                node: peer.name.clone(),
                cidr: flatnet_datapath::util::normalized(*cidr),
                via,
                carrier,
            });
        }
    }
    plan.routes.sort();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, addresses: &[&str], cidrs: &[&str]) -> Node {
        Node {
            name: name.into(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
            pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            zone: None,
        }
    }

    #[test]
    fn a_route_per_peer_cidr_via_the_address_of_its_family() {
        let nodes = vec![
            node(
                "b",
                &["172.31.0.2", "fd00::2"],
                &["10.244.2.0/24", "fd10:2::/64"],
            ),
            node("a", &["172.31.0.1"], &["10.244.1.0/24"]),
            node("c", &["172.31.0.3"], &["10.244.3.7/24"]),
        ];
        let plan = plan(&nodes, "a", &Routing::direct());
        assert_eq!(plan.own_cidrs(), ["10.244.1.0/24".parse().unwrap()]);
        let routes: Vec<String> = plan
            .routes
            .iter()
            .map(|r| format!("{} {} {}", r.node, r.cidr, r.via))
            .collect();
        assert_eq!(
            routes,
            [
                "b 10.244.2.0/24 172.31.0.2",
                "b fd10:2::/64 fd00::2",
                "c 10.244.3.0/24 172.31.0.3"
            ]
        );
    }

    #[test]
    fn peers_without_cidr_address_or_with_overlaps_are_skipped() {
        let nodes = vec![
            node("me", &["172.31.0.1"], &["10.244.1.0/24"]),
            node("late", &["172.31.0.2"], &[]),
            node("v6only", &["fd00::3"], &["10.244.3.0/24"]),
            node("clash", &["172.31.0.4"], &["10.244.1.128/25"]),
            node("first", &["172.31.0.5"], &["10.244.5.0/24"]),
            node("second", &["172.31.0.6"], &["10.244.5.0/24"]),
        ];
        let plan = plan(&nodes, "me", &Routing::direct());
        assert_eq!(plan.routes.len(), 1);
        assert_eq!(plan.routes[0].node, "first");
        assert_eq!(plan.skipped.len(), 4, "{:?}", plan.skipped);
        assert!(plan.skipped.iter().any(|s| s.contains("late")));
        assert!(plan.skipped.iter().any(|s| s.contains("no IPv4 address")));
        assert!(plan.skipped.iter().any(|s| s.contains("clash")));
        assert!(plan.skipped.iter().any(|s| s.contains("second")));
    }

    #[test]
    fn each_peer_gets_the_carrier_its_address_calls_for() {
        let nodes = vec![
            node("a", &["192.168.1.1"], &["10.244.1.0/24"]),
            node("b", &["192.168.1.2"], &["10.244.2.0/24"]),
            node(
                "c",
                &["192.168.2.3", "fd00:2::3"],
                &["10.244.3.0/24", "fd10:3::/64"],
            ),
        ];
        let routing = Routing {
            mode: RoutingMode::Auto,
            connected: vec!["192.168.1.1/24".parse().unwrap()],
        };
        let carriers: Vec<String> = plan(&nodes, "a", &routing)
            .routes
            .into_iter()
            .map(|r| format!("{} {} {:?} {}", r.node, r.cidr, r.carrier, r.via))
            .collect();
        assert_eq!(
            carriers,
            [
                "b 10.244.2.0/24 Direct 192.168.1.2",
                // The tunnel's far end is the peer's preferred address,
                // whatever the CIDR's family.
                "c 10.244.3.0/24 Vxlan 192.168.2.3",
                "c fd10:3::/64 Vxlan 192.168.2.3",
            ]
        );
    }

    #[test]
    fn a_node_missing_from_the_list_has_no_cidr() {
        let plan = plan(
            &[node("b", &["172.31.0.2"], &["10.244.2.0/24"])],
            "a",
            &Routing::direct(),
        );
        assert!(plan.me.is_none());
        assert!(plan.own_cidrs().is_empty());
        assert_eq!(plan.routes.len(), 1);
    }
}

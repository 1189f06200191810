//! The Service maps' plan, pure and unit-tested without root: the state
//! the maps should hold for the frontends (`desired`), the steps from what
//! was written to it (`steps`), and the backends that left their frontends
//! (`departed`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use flatnet_datapath::bpf::Outside;

use crate::services::Frontend;

/// A frontend: ClusterIP, port and IP protocol number.
pub type FrontendKey = (IpAddr, u16, u8);

/// What a frontend leads to: its backends (in map order),
/// sessionAffinity ClientIP's timeout in seconds (0: none), and who
/// outside the node reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub backends: Vec<SocketAddr>,
    pub affinity_secs: u32,
    pub outside: Outside,
}

/// The state the maps should hold for `frontends`: each ClusterIP's and
/// external IP's port, and each NodePort as the unspecified address of
/// each family `node_addresses` has (the datapath's wildcard for "any node
/// address", see `NODEPORT_ADDRS`), with the backends of its family (none:
/// connect() refused). Clients at the socket are all inside the cluster
/// (this node's pods and the node itself), so every address leads to the
/// Service's cluster-wide backends, as kube-proxy sends in-cluster traffic
/// to an external address (`externalTrafficPolicy` is about traffic from
/// outside). Clients outside the node reach NodePorts and external
/// addresses through the uplink program: with `externalTrafficPolicy:
/// Local` only this node's backends, listed first.
pub fn desired(
    frontends: &[Frontend<'_>],
    node_addresses: &[IpAddr],
) -> BTreeMap<FrontendKey, Target> {
    let wildcards: BTreeSet<IpAddr> = node_addresses
        .iter()
        .map(|ip| match ip {
            IpAddr::V4(_) => IpAddr::from(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::from(Ipv6Addr::UNSPECIFIED),
        })
        .collect();
    let mut out = BTreeMap::new();
    for frontend in frontends {
        let affinity_secs = frontend
            .affinity
            .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        for port in &frontend.ports {
            let cluster_ips = frontend
                .cluster_ips
                .iter()
                .map(|ip| (*ip, port.port, false));
            let external_ips = frontend
                .external_ips
                .iter()
                .map(|ip| (*ip, port.port, true));
            let node_ports = port
                .node_port
                .into_iter()
                .flat_map(|node_port| wildcards.iter().map(move |ip| (*ip, node_port, true)));
            for (ip, listening, reached) in cluster_ips.chain(external_ips).chain(node_ports) {
                let mut backends: Vec<SocketAddr> = port
                    .backends_for(ip)
                    .map(|(address, target)| SocketAddr::new(*address, *target))
                    .collect();
                let outside = match (reached, frontend.external_local) {
                    (false, _) => Outside::No,
                    (true, false) => Outside::Cluster,
                    (true, true) => {
                        let here =
                            |b: &SocketAddr| port.local_backends.contains(&(b.ip(), b.port()));
                        backends.sort_by_key(|b| !here(b));
                        let local = backends.iter().filter(|b| here(b)).count();
                        Outside::Local(u16::try_from(local).unwrap_or(u16::MAX))
                    }
                };
                out.insert(
                    (ip, listening, port.protocol.number()),
                    Target {
                        backends,
                        affinity_secs,
                        outside,
                    },
                );
            }
        }
    }
    out
}

/// One change to the maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<'a> {
    Put(FrontendKey, &'a Target),
    Delete(FrontendKey),
}

/// Which frontends an update compares: all, or those a change touched
/// (the others are known to be as written).
#[derive(Debug, Clone, Copy)]
pub enum Scope<'k> {
    All,
    Keys(&'k BTreeSet<FrontendKey>),
}

impl<'k> Scope<'k> {
    /// The entries of `map` in scope.
    fn of<'m: 's, 's>(
        self,
        map: &'m BTreeMap<FrontendKey, Target>,
    ) -> Box<dyn Iterator<Item = (&'m FrontendKey, &'m Target)> + 's>
    where
        'k: 's,
    {
        match self {
            Scope::All => Box::new(map.iter()),
            Scope::Keys(keys) => Box::new(keys.iter().filter_map(|key| map.get_key_value(key))),
        }
    }
}

/// What turns `written` into `desired` within `scope`: gone frontends
/// deleted, new and changed ones put; unchanged ones untouched.
pub fn steps<'a>(
    written: &BTreeMap<FrontendKey, Target>,
    desired: &'a BTreeMap<FrontendKey, Target>,
    scope: Scope<'_>,
) -> Vec<Step<'a>> {
    let gone = scope
        .of(written)
        .filter(|(key, _)| !desired.contains_key(key))
        .map(|(key, _)| Step::Delete(*key));
    let changed = scope
        .of(desired)
        .filter(|(key, target)| written.get(key) != Some(target))
        .map(|(key, target)| Step::Put(*key, target));
    gone.chain(changed).collect()
}

/// (frontend, backend) pairs of `written` within `scope` that `desired`
/// no longer has: the backend left the frontend, or the frontend is gone.
pub fn departed(
    written: &BTreeMap<FrontendKey, Target>,
    desired: &BTreeMap<FrontendKey, Target>,
    scope: Scope<'_>,
) -> BTreeSet<(FrontendKey, SocketAddr)> {
    // Unchanged frontends (most, at every update) are skipped whole; a
    // changed one is compared as a set, not backend by backend.
    scope
        .of(written)
        .filter(|(key, target)| desired.get(key) != Some(*target))
        .flat_map(|(key, target)| {
            let staying: BTreeSet<&SocketAddr> = desired
                .get(key)
                .map(|t| t.backends.iter().collect())
                .unwrap_or_default();
            target
                .backends
                .iter()
                .filter(move |backend| !staying.contains(backend))
                .map(move |backend| (*key, *backend))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flatnet_common::external_port;

    use super::*;
    use crate::protocol::Protocol;
    use crate::services::FrontendPort;
    use crate::services::ports::external_ports;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn frontend(backends: &[(&str, u16)], affinity: Option<u64>) -> Frontend<'static> {
        Frontend {
            namespace: "ns",
            name: "web",
            cluster_ips: vec![ip("10.96.0.10"), ip("fd96::a")],
            external_ips: Vec::new(),
            affinity: affinity.map(Duration::from_secs),
            external_local: false,
            health_check_node_port: None,
            local_ready_endpoints: 0,
            ports: vec![FrontendPort {
                name: String::new(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: None,
                backends: backends.iter().map(|(a, p)| (ip(a), *p)).collect(),
                local_backends: Vec::new(),
            }],
        }
    }

    fn cluster_ips_only(frontends: &[Frontend<'_>]) -> BTreeMap<FrontendKey, Target> {
        desired(frontends, &[])
    }

    #[test]
    fn node_ports_external_and_load_balancer_ips_lead_to_the_same_backends() {
        let mut web = frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], None);
        web.external_ips = vec![ip("198.51.100.7"), ip("2001:db8::7")];
        web.ports[0].node_port = Some(30080);
        let nodes = [ip("172.30.0.1"), ip("172.30.0.2"), ip("fd30::1")];
        let state = desired(&[web], &nodes);
        // One NodePort entry per family, whatever the number of nodes.
        let v4 = vec!["10.0.0.1:8080".parse::<SocketAddr>().unwrap()];
        let v6 = vec!["[fd00::1]:8080".parse::<SocketAddr>().unwrap()];
        for (address, port, backends) in [
            ("10.96.0.10", 80, &v4),
            ("198.51.100.7", 80, &v4),
            ("0.0.0.0", 30080, &v4),
            ("fd96::a", 80, &v6),
            ("2001:db8::7", 80, &v6),
            ("::", 30080, &v6),
        ] {
            assert_eq!(
                &state[&(ip(address), port, 6)].backends,
                backends,
                "{address}"
            );
        }
        assert_eq!(state.len(), 6);
        // No node address of a family: no NodePort entry of it.
        let mut v4_only = frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], None);
        v4_only.ports[0].node_port = Some(30080);
        let v4_nodes = desired(&[v4_only], &[ip("172.30.0.1")]);
        assert!(v4_nodes.contains_key(&(ip("0.0.0.0"), 30080, 6)));
        assert!(!v4_nodes.contains_key(&(ip("::"), 30080, 6)));
    }

    #[test]
    fn external_ports_mark_each_protocol_of_each_node_port_and_external_address() {
        let mut tcp = frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], None);
        tcp.ports[0].node_port = Some(30080);
        tcp.external_ips = vec![ip("198.51.100.7")];
        let mut udp = tcp.clone();
        udp.ports[0].protocol = Protocol::Udp;
        udp.external_ips.clear();
        let mut other = frontend(&[("10.0.0.2", 53)], None);
        other.ports[0].node_port = Some(30053);
        other.ports[0].protocol = Protocol::Udp;
        let nodes = [ip("172.30.0.1"), ip("fd30::1")];
        let ports = external_ports(&desired(&[tcp, udp, other], &nodes));
        assert_eq!(
            ports,
            BTreeMap::from([
                (
                    external_port::ANY_PORT,
                    external_port::ADDRESS_TCP
                        | external_port::NODEPORT_TCP
                        | external_port::NODEPORT_UDP
                ),
                (80, external_port::ADDRESS_TCP),
                (30053, external_port::NODEPORT_UDP),
                (
                    30080,
                    external_port::NODEPORT_TCP | external_port::NODEPORT_UDP
                )
            ])
        );
        // ClusterIP ports (80 here) alone are no outside client's.
        let cluster_only = frontend(&[("10.0.0.1", 8080)], None);
        assert!(external_ports(&desired(&[cluster_only], &nodes)).is_empty());
    }

    #[test]
    fn external_traffic_policy_local_lists_this_nodes_backends_first() {
        let mut web = frontend(&[("10.0.0.1", 8080), ("10.0.0.2", 8080)], None);
        web.ports[0].node_port = Some(30080);
        web.external_local = true;
        web.ports[0].local_backends = vec![(ip("10.0.0.2"), 8080)];
        let state = desired(&[web.clone()], &[ip("172.30.0.1")]);
        let node_port = &state[&(ip("0.0.0.0"), 30080, 6)];
        assert_eq!(
            node_port.backends,
            vec![
                "10.0.0.2:8080".parse::<SocketAddr>().unwrap(),
                "10.0.0.1:8080".parse().unwrap()
            ]
        );
        assert_eq!(node_port.outside, Outside::Local(1));
        // The ClusterIP keeps its order and is no outside client's.
        assert_eq!(state[&(ip("10.96.0.10"), 80, 6)].outside, Outside::No);
        web.external_local = false;
        let state = desired(&[web], &[ip("172.30.0.1")]);
        assert_eq!(state[&(ip("0.0.0.0"), 30080, 6)].outside, Outside::Cluster);
    }

    #[test]
    fn each_cluster_ip_gets_the_backends_of_its_family() {
        let state =
            cluster_ips_only(&[frontend(&[("10.0.0.1", 8080), ("fd00::1", 8080)], Some(60))]);
        assert_eq!(
            state[&(ip("10.96.0.10"), 80, 6)],
            Target {
                backends: vec!["10.0.0.1:8080".parse().unwrap()],
                affinity_secs: 60,
                outside: Outside::No,
            }
        );
        assert_eq!(
            state[&(ip("fd96::a"), 80, 6)].backends,
            vec!["[fd00::1]:8080".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn backends_that_leave_or_lose_their_frontend_have_departed() {
        let both = cluster_ips_only(&[frontend(&[("10.0.0.1", 53), ("10.0.0.2", 53)], None)]);
        let one = cluster_ips_only(&[frontend(&[("10.0.0.2", 53)], None)]);
        let backend = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            departed(&both, &one, Scope::All),
            BTreeSet::from([((ip("10.96.0.10"), 80, 6), backend("10.0.0.1:53"))])
        );
        // Joining is no departure; nothing changed, nothing departed.
        assert!(departed(&one, &both, Scope::All).is_empty());
        assert!(departed(&both, &both, Scope::All).is_empty());
        // The Service deleted: every backend departed from it.
        assert_eq!(departed(&both, &BTreeMap::new(), Scope::All).len(), 2);
    }

    #[test]
    fn only_changed_frontends_are_written() {
        let before = cluster_ips_only(&[frontend(&[("10.0.0.1", 8080)], None)]);
        // Nothing changed: nothing to do (an agent restart).
        assert!(steps(&before, &before, Scope::All).is_empty());
        // One backend more: only the IPv4 frontend is put again.
        let after = cluster_ips_only(&[frontend(&[("10.0.0.1", 8080), ("10.0.0.2", 8080)], None)]);
        let planned = steps(&before, &after, Scope::All);
        assert_eq!(planned.len(), 1);
        assert!(matches!(planned[0], Step::Put((a, 80, 6), _) if a == ip("10.96.0.10")));
        // The Service gone: both frontends deleted.
        let nothing = BTreeMap::new();
        let planned = steps(&after, &nothing, Scope::All);
        assert_eq!(
            planned,
            vec![
                Step::Delete((ip("10.96.0.10"), 80, 6)),
                Step::Delete((ip("fd96::a"), 80, 6))
            ]
        );
    }

    #[test]
    fn keys_in_scope_alone_are_compared() {
        let before = cluster_ips_only(&[frontend(&[("10.0.0.1", 53)], None)]);
        let after = cluster_ips_only(&[frontend(&[("10.0.0.2", 53)], None)]);
        let v4 = (ip("10.96.0.10"), 80, 6);
        let only_v4 = BTreeSet::from([v4]);
        let nothing = BTreeSet::new();
        let planned = steps(&before, &after, Scope::Keys(&only_v4));
        assert!(matches!(planned[..], [Step::Put(key, _)] if key == v4));
        assert!(steps(&before, &after, Scope::Keys(&nothing)).is_empty());
        let backend: SocketAddr = "10.0.0.1:53".parse().unwrap();
        assert_eq!(
            departed(&before, &after, Scope::Keys(&only_v4)),
            BTreeSet::from([(v4, backend)])
        );
        assert!(departed(&before, &after, Scope::Keys(&nothing)).is_empty());
        // A frontend in scope that is no longer desired: deleted.
        let none = BTreeMap::new();
        let planned = steps(&before, &none, Scope::Keys(&only_v4));
        assert_eq!(planned, vec![Step::Delete(v4)]);
    }
}

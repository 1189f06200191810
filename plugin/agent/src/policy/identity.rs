//! Peer identities: what a policy can tell apart about the pod behind an
//! address, numbered, so a node's tables name peers by number instead of
//! repeating every peer pod's address.
//!
//! A peer selector (a rule's `podSelector` and `namespaceSelector`) sees a
//! pod's namespace and labels, and an egress rule's named port its
//! container ports. Two pods that agree on the namespace, on the labels
//! whose keys some selector of the node's policies mentions, and (when
//! such a rule exists) on their named ports, are matched by exactly the
//! same rules: they share one identity. Pods of one Deployment do (their
//! `pod-template-hash` is the same, and no policy names it anyway), so a
//! table holds one entry for all of them, and a pod of an existing
//! identity coming or going changes one address entry on a node.
//!
//! Host-network pods share their node's address: an address's identity is
//! the set of what its pods show (one member for an ordinary pod), and a
//! selector matches the address when it matches one of its members.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use super::network_policy::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, Selector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// What one pod shows to selectors.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub namespace: String,
    /// Only the labels whose keys a peer selector mentions.
    pub labels: BTreeMap<String, String>,
    /// (name, protocol, port), sorted; empty unless an egress rule names a
    /// port.
    pub named_ports: Vec<(String, String, i32)>,
}

/// The identity of an address: what every pod with it shows.
pub type IdentityKey = BTreeSet<Member>;

/// What the node's policies look at in a peer: the label keys their peer
/// selectors mention, and whether an egress rule names a port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relevant {
    pub label_keys: BTreeSet<String>,
    pub named_ports: bool,
}

impl Relevant {
    pub fn of(policies: &[&NetworkPolicy]) -> Self {
        let mut relevant = Relevant::default();
        for spec in policies.iter().filter_map(|p| p.spec.as_ref()) {
            let ingress = spec.ingress.iter().flatten();
            for rule in ingress {
                relevant.peers(rule.from.as_deref());
            }
            for rule in spec.egress.iter().flatten() {
                relevant.peers(rule.to.as_deref());
                let mut ports = rule.ports.iter().flatten();
                if ports.any(is_named) {
                    relevant.named_ports = true;
                }
            }
        }
        relevant
    }

    fn peers(&mut self, peers: Option<&[NetworkPolicyPeer]>) {
        for selector in peers
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.pod_selector.as_ref())
        {
            self.selector(selector);
        }
    }

    fn selector(&mut self, selector: &Selector) {
        self.label_keys.extend(
            selector
                .match_labels
                .iter()
                .flatten()
                .map(|(k, _)| k.clone()),
        );
        let expressions = selector.match_expressions.iter().flatten();
        self.label_keys.extend(expressions.map(|e| e.key.clone()));
    }
}

fn is_named(port: &NetworkPolicyPort) -> bool {
    matches!(port.port, Some(IntOrString::String(_)))
}

/// Numbers for identities that stay the same from one plan to the next
/// (a table entry and an address entry written under one plan still mean
/// the same under the next), and across an agent restart: the numbers the
/// datapath holds by address are hints the first plan takes up. 0 is
/// never used: it means no identity.
#[derive(Debug, Default)]
pub struct IdentityNumbers {
    by_key: HashMap<IdentityKey, u32>,
    /// Numbers given, and numbers hinted until the next `retain`.
    taken: HashSet<u32>,
    hints: HashMap<IpAddr, u32>,
    /// The hints by number, until an identity takes one up.
    hinted: HashMap<u32, Vec<IpAddr>>,
    last: u32,
}

impl IdentityNumbers {
    /// Numbering that starts from what the datapath holds (address ->
    /// number, from before a restart).
    pub fn with_hints(hints: HashMap<IpAddr, u32>) -> Self {
        let mut hinted: HashMap<u32, Vec<IpAddr>> = HashMap::new();
        for (address, number) in &hints {
            hinted.entry(*number).or_default().push(*address);
        }
        IdentityNumbers {
            taken: hints.values().copied().filter(|n| *n != 0).collect(),
            last: hints.values().copied().max().unwrap_or(0),
            hints,
            hinted,
            by_key: HashMap::new(),
        }
    }

    /// The number of `key`, the identity of `addresses`: the one it has,
    /// else one hinted for its addresses that no other identity took and
    /// that no other address holds (an address elsewhere with that number
    /// would change meaning under tables written for `key`), else a fresh
    /// one.
    pub fn number(&mut self, key: &IdentityKey, addresses: &[IpAddr]) -> u32 {
        if let Some(&number) = self.by_key.get(key) {
            return number;
        }
        let mine: HashSet<&IpAddr> = addresses.iter().collect();
        // A hint still in `hinted` is no identity's yet (taken up, it goes).
        let only_mine = |n: u32| {
            self.hinted
                .get(&n)
                .is_some_and(|holders| holders.iter().all(|a| mine.contains(a)))
        };
        let hinted = addresses
            .iter()
            .filter_map(|a| self.hints.get(a).copied())
            .find(|n| *n != 0 && only_mine(*n));
        let number = match hinted {
            Some(number) => {
                self.hinted.remove(&number);
                number
            }
            None => loop {
                self.last = self.last.wrapping_add(1);
                if self.last != 0 && !self.taken.contains(&self.last) {
                    break self.last;
                }
            },
        };
        self.taken.insert(number);
        self.by_key.insert(key.clone(), number);
        number
    }

    /// Forgets every identity but those in `used`, and the hints: their
    /// numbers may be given again, much later (numbers are handed out in
    /// a circle).
    pub fn retain(&mut self, used: &HashSet<u32>) {
        self.by_key.retain(|_, n| used.contains(n));
        self.taken = self.by_key.values().copied().collect();
        self.hints.clear();
        self.hinted.clear();
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// One identity of the cluster's peers.
#[derive(Debug, Clone)]
pub struct PeerIdentity {
    pub number: u32,
    /// One pod (an index into the cluster's peers) per member, in the
    /// members' order: selectors are matched against it.
    pub members: Vec<usize>,
    /// The addresses with this identity, sorted.
    pub addresses: Vec<IpAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, app: &str) -> IdentityKey {
        BTreeSet::from([Member {
            namespace: namespace.into(),
            labels: BTreeMap::from([("app".into(), app.into())]),
            named_ports: Vec::new(),
        }])
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn numbers_stay_and_are_not_given_twice() {
        let mut numbers = IdentityNumbers::default();
        let a = numbers.number(&key("x", "a"), &[]);
        let b = numbers.number(&key("x", "b"), &[]);
        assert_ne!(a, b);
        assert_eq!(numbers.number(&key("x", "a"), &[]), a);
        numbers.retain(&HashSet::from([b]));
        assert_ne!(numbers.number(&key("x", "c"), &[]), b);
        assert_eq!(numbers.number(&key("x", "b"), &[]), b);
    }

    #[test]
    fn hints_from_the_datapath_are_taken_up_once() {
        let hints = HashMap::from([
            (ip("10.0.0.1"), 7),
            (ip("10.0.0.2"), 7),
            (ip("10.0.0.3"), 9),
            (ip("10.0.0.4"), 8),
            (ip("10.0.0.5"), 8),
        ]);
        let mut numbers = IdentityNumbers::with_hints(hints);
        // A fresh number never takes a hinted one.
        assert_eq!(numbers.number(&key("x", "new"), &[]), 10);
        let a = [ip("10.0.0.1"), ip("10.0.0.2")];
        assert_eq!(numbers.number(&key("x", "a"), &a), 7);
        // 8 is also 10.0.0.5's, which is not d's: d may not take it (the
        // tables written for d would let 10.0.0.5 in under d's name).
        assert_eq!(numbers.number(&key("x", "d"), &[ip("10.0.0.4")]), 11);
        // 10.0.0.2 had 7 too, but a took it: b gets a fresh number.
        assert_eq!(numbers.number(&key("x", "b"), &[ip("10.0.0.2")]), 12);
        numbers.retain(&HashSet::from([7, 10, 11, 12]));
        // 9 was only hinted: free again, and hints are gone.
        assert_eq!(numbers.number(&key("x", "c"), &[ip("10.0.0.3")]), 13);
    }

    #[test]
    fn numbering_wraps_around_past_zero_and_taken_ones() {
        let mut numbers = IdentityNumbers::with_hints(HashMap::from([
            (ip("10.0.0.1"), u32::MAX),
            (ip("10.0.0.2"), 1),
        ]));
        assert_eq!(numbers.number(&key("x", "c"), &[]), 2);
    }
}

//! Keeping the sink's peer identities (address -> identity number) in line
//! with the plan's: new ones before the tables naming them are written,
//! changed and gone ones after, and the flows a pod recorded judged again
//! when a peer it allowed by identity left that identity.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use super::{PolicySink, PolicySync};
use crate::policy::{Allowed, Plan};

impl<S: PolicySink> PolicySync<S> {
    /// Writes the plan's addresses the sink lacks (all of them when what
    /// it holds is unknown). Changed ones wait for `settle_peer_ids`.
    pub(super) fn add_peer_ids(&mut self, plan: &Plan) {
        let held = self.peer_ids.as_ref();
        let new: Vec<(IpAddr, u32)> = plan
            .addresses
            .iter()
            .filter(|(a, _)| held.is_none_or(|h| !h.contains_key(*a)))
            .map(|(a, n)| (*a, *n))
            .collect();
        if new.is_empty() {
            return;
        }
        match self.sink.write_peer_ids(&new) {
            Ok(()) => {
                if let Some(held) = &mut self.peer_ids {
                    held.extend(new);
                }
            }
            Err(e) => self.peer_ids_failed(&e),
        }
    }

    /// Makes the sink's addresses the plan's: changed ones rewritten, gone
    /// ones removed; then the pods whose tables named a peer's old
    /// identity have their flows judged again.
    pub(super) fn settle_peer_ids(&mut self, previous: &Plan, plan: &Plan) {
        let held = match self.peer_ids.take() {
            Some(held) => held,
            // Unknown: read back, else everything the previous plan had is
            // rewritten.
            None => self
                .sink
                .peer_ids()
                .unwrap_or_else(|_| previous.addresses.clone()),
        };
        let changed: Vec<(IpAddr, u32)> = plan
            .addresses
            .iter()
            .filter(|(a, n)| held.get(*a).is_none_or(|h| h != *n))
            .map(|(a, n)| (*a, *n))
            .collect();
        let gone: Vec<IpAddr> = held
            .keys()
            .filter(|a| !plan.addresses.contains_key(*a))
            .copied()
            .collect();
        let left: HashSet<u32> = held
            .iter()
            .filter(|(a, n)| plan.addresses.get(*a) != Some(*n))
            .map(|(_, n)| *n)
            .collect();
        // Gone ones first: in a full map they make room.
        if let Err(e) = self.sink.remove_peer_ids(&gone) {
            return self.peer_ids_failed(&e);
        }
        if let Err(e) = self.sink.write_peer_ids(&changed) {
            return self.peer_ids_failed(&e);
        }
        self.peer_ids = Some(plan.addresses.clone());
        self.peer_ids_failure = None;
        self.rejudge_naming(plan, &left);
    }

    /// Has the flows of each pod whose tables name an identity in `left`
    /// judged again: a peer address left it.
    fn rejudge_naming(&mut self, plan: &Plan, left: &HashSet<u32>) {
        if left.is_empty() {
            return;
        }
        // A pod whose table no longer names it was rewritten already.
        for result in plan.pods.values() {
            let Ok(policy) = result else { continue };
            let names = |a: &Allowed| match a {
                Allowed::All => false,
                Allowed::Only(t) => t.peers.keys().any(|n| left.contains(n)),
            };
            if (names(&policy.ingress) || names(&policy.egress))
                && let Err(e) = self.sink.rejudge(&policy.ips)
            {
                self.metrics.policy_errors.inc();
                tracing::warn!(error = %e, ips = ?policy.ips, "cannot have a pod's recorded flows judged again");
            }
        }
    }

    /// Peer addresses whose identity changed while no table did (see
    /// `policy::incremental`): `changes` gives each its named identity now,
    /// None for none. Written at once (gone ones first, as they make room),
    /// then the pods whose tables named an identity one of them left have
    /// their flows judged again, as after a whole plan.
    pub fn update_addresses(&mut self, changes: &BTreeMap<IpAddr, Option<u32>>) {
        let Some(mut plan) = self.plan.take() else {
            return;
        };
        for (address, number) in changes {
            match number {
                Some(n) => plan.addresses.insert(*address, *n),
                None => plan.addresses.remove(address),
            };
        }
        match self.peer_ids.take() {
            // What the sink holds is unknown: everything settled again.
            None => {
                self.add_peer_ids(&plan);
                self.settle_peer_ids(&plan, &plan);
            }
            Some(mut held) => {
                let (mut gone, mut write, mut left) = (Vec::new(), Vec::new(), HashSet::new());
                for (address, number) in changes {
                    let old = held.get(address).copied();
                    if old == *number {
                        continue;
                    }
                    left.extend(old);
                    match number {
                        Some(n) => write.push((*address, *n)),
                        None => gone.push(*address),
                    }
                }
                let written = self
                    .sink
                    .remove_peer_ids(&gone)
                    .and_then(|()| self.sink.write_peer_ids(&write));
                match written {
                    Err(e) => self.peer_ids_failed(&e),
                    Ok(()) => {
                        for address in &gone {
                            held.remove(address);
                        }
                        held.extend(write);
                        self.peer_ids = Some(held);
                        self.rejudge_naming(&plan, &left);
                    }
                }
            }
        }
        self.metrics
            .policy_peer_addresses
            .set(plan.addresses.len() as i64);
        self.report_pressure(&plan);
        self.plan = Some(plan);
    }

    fn peer_ids_failed(&mut self, error: &crate::error::AgentError) {
        self.metrics.policy_errors.inc();
        tracing::warn!(%error, "cannot write the identities of peer addresses; retrying at the next resync (until then those peers are denied)");
        self.peer_ids = None;
        self.peer_ids_failure = Some(error.to_string());
    }

    /// The peer identities the sink holds, as last written.
    pub fn peer_ids(&self) -> Option<&BTreeMap<IpAddr, u32>> {
        self.peer_ids.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::tests::{calls, ip, key, only, plan, pod, synced};
    use crate::policy::{Allowed, Plan, PortSet};

    /// `a/web` (10.0.0.2) letting in identity 7 on any port, with
    /// `addresses` (address -> identity).
    fn by_identity(addresses: &[(&str, u32)]) -> Plan {
        let mut allowed = only("192.0.2.0/24", 80);
        if let Allowed::Only(table) = &mut allowed {
            table.peers = BTreeMap::from([(7, PortSet::Any)]);
        }
        let mut plan = plan(vec![("a/web", pod("10.0.0.2", allowed))]);
        plan.addresses = addresses.iter().map(|(a, n)| (ip(a), *n)).collect();
        plan
    }

    #[test]
    fn new_identities_go_before_the_tables_changed_and_gone_ones_after() {
        let mut sync = synced(&["10.0.0.2"]);
        sync.update(by_identity(&[("10.1.0.5", 7), ("10.1.0.6", 8)]));
        let first = calls(&mut sync);
        assert_eq!(first[..2], ["id 10.1.0.5=7", "id 10.1.0.6=8"]);
        assert!(first[2].starts_with("write a/web"), "{first:?}");
        assert_eq!(first.len(), 3);

        // A peer of identity 7 coming: one address entry, no table.
        sync.update(by_identity(&[
            ("10.1.0.5", 7),
            ("10.1.0.6", 8),
            ("10.1.0.9", 7),
        ]));
        assert_eq!(calls(&mut sync), ["id 10.1.0.9=7"]);

        // 10.1.0.5 leaves identity 7, 10.1.0.9 goes: a/web named 7, so its
        // recorded flows are judged again, after the entries changed.
        sync.update(by_identity(&[("10.1.0.5", 8), ("10.1.0.6", 8)]));
        assert_eq!(
            calls(&mut sync),
            ["id 10.1.0.9 gone", "id 10.1.0.5=8", "rejudge [10.0.0.2]"]
        );

        // 10.1.0.6 leaving 8 concerns no table here: nothing judged again.
        sync.update(by_identity(&[("10.1.0.5", 8)]));
        assert_eq!(calls(&mut sync), ["id 10.1.0.6 gone"]);
    }

    #[test]
    fn a_failed_write_is_done_again_at_the_next_resync() {
        let mut sync = synced(&["10.0.0.2"]);
        sync.sink.failing.insert("peer ids".into());
        sync.update(by_identity(&[("10.1.0.5", 7)]));
        assert_eq!(sync.peer_ids(), None, "unknown after a failure");
        let problem = sync.problem().unwrap_or_default();
        assert!(
            problem.contains("peers are denied (invalid setting: peer ids: refused)"),
            "{problem}"
        );
        assert!(calls(&mut sync)[0].starts_with("write a/web"));
        sync.sink.failing.clear();
        sync.resync(&[]);
        assert_eq!(calls(&mut sync)[0], "id 10.1.0.5=7");
        assert_eq!(
            sync.peer_ids(),
            Some(&BTreeMap::from([(ip("10.1.0.5"), 7)]))
        );
        let _ = key("a/web");
    }

    #[test]
    fn followed_address_changes_are_written_as_a_whole_plan_would_write_them() {
        let mut sync = synced(&["10.0.0.2"]);
        sync.update(by_identity(&[("10.1.0.5", 7), ("10.1.0.6", 8)]));
        calls(&mut sync);
        let change = |pairs: &[(&str, Option<u32>)]| -> BTreeMap<_, _> {
            pairs.iter().map(|(a, n)| (ip(a), *n)).collect()
        };
        // A peer of identity 7 coming, one of no named identity, one
        // unchanged: one address entry, no table.
        sync.update_addresses(&change(&[
            ("10.1.0.9", Some(7)),
            ("10.1.0.10", None),
            ("10.1.0.6", Some(8)),
        ]));
        assert_eq!(calls(&mut sync), ["id 10.1.0.9=7"]);
        // 10.1.0.5 leaves 7 for 8, 10.1.0.9 goes: a/web named 7.
        sync.update_addresses(&change(&[("10.1.0.5", Some(8)), ("10.1.0.9", None)]));
        assert_eq!(
            calls(&mut sync),
            ["id 10.1.0.9 gone", "id 10.1.0.5=8", "rejudge [10.0.0.2]"]
        );
        let held = BTreeMap::from([(ip("10.1.0.5"), 8), (ip("10.1.0.6"), 8)]);
        assert_eq!(sync.peer_ids(), Some(&held));
        // The plan kept follows: a whole plan equal to it writes nothing.
        sync.update(by_identity(&[("10.1.0.5", 8), ("10.1.0.6", 8)]));
        assert_eq!(calls(&mut sync), Vec::<String>::new());
    }
}

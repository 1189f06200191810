//! Keeping the datapath in line with the node's NetworkPolicy plan: after
//! each computation only the pods whose result changed are written (plus
//! those waiting for a retry), through a [`PolicySink`] (the datapath's
//! maps on a node, a recording fake in tests).
//!
//! - A pod whose result is an error ([`PolicyError`]) is logged and keeps
//!   what was written for it before.
//! - A pod whose address is not in the datapath yet (its ADD is still in
//!   flight) is tried again at the next change or resync, as is a pod whose
//!   write failed.
//! - A pod that left the plan (deleted, finished) has its policy taken
//!   away, unless its address already belongs to a pod of the plan.
//! - The node's own addresses go to the sink at each resync: traffic from
//!   the node (kubelet's probes) passes any ingress policy.

mod datapath;
mod identities;
mod pressure;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use crate::error::Result;
use crate::metrics::{AgentMetrics, DirectionLabel};
use crate::policy::{Allowed, Direction, Plan, PodKey, PodPolicy, PolicyError};

pub use datapath::{DatapathSink, rules};

/// What enforces pods' policies.
pub trait PolicySink {
    /// Writes `policy` for `pod` (whose addresses are `ips`), or, with None,
    /// takes the policy of the pod that had `ips` away.
    fn apply(
        &mut self,
        pod: &PodKey,
        ips: &[IpAddr],
        policy: Option<&PodPolicy>,
    ) -> Result<Applied>;

    /// Makes `addresses` the node's own: traffic from them is always allowed.
    fn local_addresses(&mut self, addresses: &[IpAddr]) -> Result<()>;

    /// Whether what `apply` wrote for `policy` is still there (a datapath
    /// reloaded over wiped pins starts with empty policy maps).
    fn in_place(&mut self, _policy: &PodPolicy) -> bool {
        true
    }

    /// The peer identities it holds by address (a restarted agent finds
    /// the last one's).
    fn peer_ids(&mut self) -> Result<BTreeMap<IpAddr, u32>> {
        Ok(BTreeMap::new())
    }

    /// Gives each of `addresses` its identity number (new entries and
    /// changed ones), for the tables that name peers by identity.
    fn write_peer_ids(&mut self, _addresses: &[(IpAddr, u32)]) -> Result<()> {
        Ok(())
    }

    /// Takes these addresses' identities away.
    fn remove_peer_ids(&mut self, _addresses: &[IpAddr]) -> Result<()> {
        Ok(())
    }

    /// Has the flows the pod with `ips` recorded judged again: a peer it
    /// allowed by identity left that identity.
    fn rejudge(&mut self, _ips: &[IpAddr]) -> Result<()> {
        Ok(())
    }

    /// How many entries map `name` holds at most, as made; None: unknown
    /// (the built-in size is taken).
    fn capacity(&mut self, _name: &str) -> Option<u32> {
        None
    }

    /// Records which policies select each pod, by pod address, for people
    /// (`flatnet inspect`).
    fn policy_names(&mut self, _names: &BTreeMap<IpAddr, Vec<String>>) -> Result<()> {
        Ok(())
    }
}

/// Pod address -> the policies selecting that pod (`namespace/name`), for
/// every pod of `plan` some policy selects.
pub fn policy_names(plan: &Plan) -> BTreeMap<IpAddr, Vec<String>> {
    let mut names = BTreeMap::new();
    for (key, result) in &plan.pods {
        let Ok(policy) = result else { continue };
        if policy.policies.is_empty() {
            continue;
        }
        let qualified: Vec<String> = policy
            .policies
            .iter()
            .map(|name| format!("{}/{name}", key.namespace))
            .collect();
        for ip in &policy.ips {
            names.insert(*ip, qualified.clone());
        }
    }
    names
}

/// What [`PolicySink::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The pod's maps were rewritten.
    Written,
    /// Nothing needed writing (e.g. a pod never isolated stays so).
    Unchanged,
    /// None of the pod's addresses is in the datapath yet: try again later.
    NotAttached,
}

/// One thing to do for one pod.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// The pod left the plan: what was written for it goes.
    Remove(PodKey),
    Write(&'a PodKey, &'a PodPolicy),
    /// Its result is an error: what it had stays.
    Keep(&'a PodKey, &'a PolicyError),
}

/// What to do to go from `previous` to `next`: the changed pods and those
/// in `retry`, removals first (an address a gone pod leaves may already be
/// a new pod's, which must be written after it).
pub fn steps<'a>(previous: &Plan, next: &'a Plan, retry: &BTreeSet<PodKey>) -> Vec<Step<'a>> {
    let mut keys: BTreeSet<PodKey> = next.changed_since(previous).into_iter().collect();
    keys.extend(retry.iter().cloned());
    let mut removals = Vec::new();
    let mut writes = Vec::new();
    for key in keys {
        match next.pods.get_key_value(&key) {
            None => removals.push(Step::Remove(key)),
            Some((key, Ok(policy))) => writes.push(Step::Write(key, policy)),
            Some((key, Err(error))) => writes.push(Step::Keep(key, error)),
        }
    }
    removals.extend(writes);
    removals
}

/// Whether a result isolates (ingress, egress); None for an error.
fn isolation(result: Option<&Result<PodPolicy, PolicyError>>) -> Option<(bool, bool)> {
    match result {
        None => Some((false, false)),
        Some(Ok(p)) => Some((
            matches!(p.ingress, Allowed::Only(_)),
            matches!(p.egress, Allowed::Only(_)),
        )),
        Some(Err(_)) => None,
    }
}

/// The plan in force and what the sink holds.
pub struct PolicySync<S> {
    sink: S,
    metrics: AgentMetrics,
    /// The last plan computed; None before the first.
    plan: Option<Plan>,
    /// Pods with a policy written by this agent, and their addresses then.
    written: BTreeMap<PodKey, Vec<IpAddr>>,
    /// Pods to try again: not attached yet, or a failed write or removal.
    retry: BTreeSet<PodKey>,
    /// The peer identities the sink holds by address; None: unknown (a
    /// write failed), all written again at the next resync.
    peer_ids: Option<BTreeMap<IpAddr, u32>>,
    /// Pods whose policy could not be written, and why (the sink holds
    /// them closed meanwhile); why the peer identities could not be.
    failures: BTreeMap<PodKey, String>,
    peer_ids_failure: Option<String>,
}

impl<S: PolicySink> PolicySync<S> {
    pub fn new(mut sink: S, metrics: AgentMetrics) -> Self {
        let peer_ids = sink.peer_ids().ok();
        PolicySync {
            sink,
            metrics,
            plan: None,
            written: BTreeMap::new(),
            retry: BTreeSet::new(),
            peer_ids,
            failures: BTreeMap::new(),
            peer_ids_failure: None,
        }
    }

    /// What keeps the node's policy from being what the plan says, for
    /// readiness: pods whose policy could not be written (held closed),
    /// peer addresses without their identity (denied). None: all written.
    pub fn problem(&self) -> Option<String> {
        let mut problems = Vec::new();
        if let Some((pod, error)) = self.failures.iter().next() {
            problems.push(format!(
                "the policy of {} pod(s) cannot be written, so they are held closed (first, {pod}: {error})",
                self.failures.len()
            ));
        }
        if let Some(error) = &self.peer_ids_failure {
            problems.push(format!(
                "the identities of peer addresses cannot be written, so those peers are denied ({error})"
            ));
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Pods waiting for a retry.
    pub fn waiting(&self) -> &BTreeSet<PodKey> {
        &self.retry
    }

    /// Takes `plan` as the node's: logs pods whose isolation changed,
    /// updates the gauges and writes the changed and waiting pods.
    pub fn update(&mut self, plan: Plan) {
        let previous = self.plan.take().unwrap_or_default();
        for key in plan.changed_since(&previous) {
            let (before, after) = (previous.pods.get(&key), plan.pods.get(&key));
            if let (Some(was), Some(now)) = (isolation(before), isolation(after))
                && was != now
                && let Some(Ok(policy)) = after
            {
                tracing::info!(
                    pod = %key,
                    ingress_isolated = now.0,
                    egress_isolated = now.1,
                    policies = ?policy.policies,
                    "pod isolation changed"
                );
            }
        }
        for (direction, name) in [
            (Direction::Ingress, "ingress"),
            (Direction::Egress, "egress"),
        ] {
            let isolated = plan
                .pods
                .values()
                .filter(|r| match (r, direction) {
                    (Ok(p), Direction::Ingress) => matches!(p.ingress, Allowed::Only(_)),
                    (Ok(p), Direction::Egress) => matches!(p.egress, Allowed::Only(_)),
                    (Err(_), _) => false,
                })
                .count();
            self.metrics
                .policy_isolated
                .get_or_create(&DirectionLabel {
                    direction: name.into(),
                })
                .set(isolated as i64);
        }
        let identities: HashSet<u32> = plan.addresses.values().copied().collect();
        let metrics = &self.metrics;
        metrics
            .policy_peer_addresses
            .set(plan.addresses.len() as i64);
        metrics.policy_identities.set(identities.len() as i64);
        let retry = std::mem::take(&mut self.retry);
        // Addresses of new identities before the tables that name them;
        // changed and gone ones after, when no table needs the old.
        self.add_peer_ids(&plan);
        self.take_steps(&previous, &plan, &retry);
        self.settle_peer_ids(&previous, &plan);
        self.report_pressure(&plan);
        if let Err(e) = self.sink.policy_names(&policy_names(&plan)) {
            tracing::warn!(error = %e, "cannot record which policies select each pod");
        }
        self.plan = Some(plan);
    }

    /// At each resync: the node's own addresses, and the waiting pods.
    pub fn resync(&mut self, local: &[IpAddr]) {
        if let Err(e) = self.sink.local_addresses(local) {
            self.metrics.policy_errors.inc();
            tracing::warn!(error = %e, addresses = ?local, "cannot write the node's addresses for policy");
        }
        // Written pods whose isolation is gone from the maps (pins wiped,
        // datapath reloaded) are written again.
        if let Some(plan) = &self.plan {
            for (key, result) in &plan.pods {
                if let Ok(policy) = result
                    && self.written.contains_key(key)
                    && !self.sink.in_place(policy)
                {
                    self.retry.insert(key.clone());
                }
            }
        }
        if self.peer_ids.is_none()
            && let Some(plan) = self.plan.take()
        {
            self.add_peer_ids(&plan);
            self.settle_peer_ids(&plan, &plan);
            self.plan = Some(plan);
        }
        if self.retry.is_empty() {
            return;
        }
        let Some(plan) = self.plan.take() else {
            return;
        };
        let retry = std::mem::take(&mut self.retry);
        // Against itself: only the waiting pods are taken again.
        self.take_steps(&plan, &plan, &retry);
        self.report_pressure(&plan);
        self.plan = Some(plan);
    }

    fn take_steps(&mut self, previous: &Plan, next: &Plan, retry: &BTreeSet<PodKey>) {
        // A gone pod's address that a pod of the plan holds now is that
        // pod's: not taken away.
        let claimed: HashSet<IpAddr> = next
            .pods
            .values()
            .filter_map(|r| r.as_ref().ok())
            .flat_map(|p| p.ips.iter().copied())
            .collect();
        for step in steps(previous, next, retry) {
            match step {
                Step::Remove(key) => {
                    self.failures.remove(&key);
                    // Never written (or already taken away): nothing to do.
                    let Some(ips) = self.written.get(&key) else {
                        continue;
                    };
                    let ips: Vec<IpAddr> = ips
                        .iter()
                        .copied()
                        .filter(|ip| !claimed.contains(ip))
                        .collect();
                    match self.sink.apply(&key, &ips, None) {
                        Ok(applied) => {
                            self.written.remove(&key);
                            self.failures.remove(&key);
                            if applied == Applied::Written {
                                self.metrics.policy_updates.inc();
                            }
                        }
                        Err(e) => {
                            self.metrics.policy_errors.inc();
                            tracing::warn!(pod = %key, error = %e, "cannot take a gone pod's policy away; retrying");
                            self.retry.insert(key);
                        }
                    }
                }
                Step::Write(key, policy) => match self.sink.apply(key, &policy.ips, Some(policy)) {
                    Ok(Applied::NotAttached) => {
                        tracing::debug!(pod = %key, "pod not in the datapath yet; policy waits");
                        self.retry.insert(key.clone());
                    }
                    Ok(applied) => {
                        self.written.insert(key.clone(), policy.ips.clone());
                        self.failures.remove(key);
                        if applied == Applied::Written {
                            self.metrics.policy_updates.inc();
                        }
                    }
                    Err(e) => {
                        self.metrics.policy_errors.inc();
                        tracing::warn!(pod = %key, error = %e, "cannot write a pod's policy: it is held closed, retrying");
                        self.failures.insert(key.clone(), e.to_string());
                        self.retry.insert(key.clone());
                    }
                },
                Step::Keep(key, error) => {
                    self.metrics.policy_errors.inc();
                    tracing::warn!(pod = %key, %error, "pod's policy cannot be computed; it keeps what it had");
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::error::AgentError;
    use crate::metrics;
    use crate::policy::{Entry, PortRange, PortSet, Table};
    use crate::protocol::Protocol;
    use flatnet_datapath::bpf::{Datapath, PolicyPortRange, PolicyPorts};

    /// Records what it is asked; pods with an address in `attached` are
    /// in the datapath, those in `failing` fail.
    #[derive(Default)]
    pub(super) struct Recorder {
        pub(super) calls: Vec<String>,
        pub(super) attached: HashSet<IpAddr>,
        pub(super) failing: HashSet<String>,
        pub(super) local: Vec<IpAddr>,
    }

    impl PolicySink for Recorder {
        fn apply(
            &mut self,
            pod: &PodKey,
            ips: &[IpAddr],
            policy: Option<&PodPolicy>,
        ) -> Result<Applied> {
            if self.failing.contains(&pod.to_string()) {
                return Err(AgentError::Config(format!("{pod}: refused")));
            }
            let Some(policy) = policy else {
                self.calls.push(format!("remove {pod} {ips:?}"));
                return Ok(Applied::Written);
            };
            if !ips.iter().any(|ip| self.attached.contains(ip)) {
                return Ok(Applied::NotAttached);
            }
            let describe = |a: &Allowed| match rules(a) {
                None => "all".to_string(),
                Some(rules) => rules
                    .iter()
                    .map(|r| format!("{}:{:?}", r.cidr, r.ports))
                    .collect::<Vec<_>>()
                    .join(","),
            };
            self.calls.push(format!(
                "write {pod} in={} out={}",
                describe(&policy.ingress),
                describe(&policy.egress)
            ));
            Ok(Applied::Written)
        }

        fn local_addresses(&mut self, addresses: &[IpAddr]) -> Result<()> {
            self.local = addresses.to_vec();
            Ok(())
        }

        fn write_peer_ids(&mut self, addresses: &[(IpAddr, u32)]) -> Result<()> {
            if self.failing.contains("peer ids") {
                return Err(AgentError::Config("peer ids: refused".into()));
            }
            for (address, identity) in addresses {
                self.calls.push(format!("id {address}={identity}"));
            }
            Ok(())
        }

        fn remove_peer_ids(&mut self, addresses: &[IpAddr]) -> Result<()> {
            for address in addresses {
                self.calls.push(format!("id {address} gone"));
            }
            Ok(())
        }

        fn rejudge(&mut self, ips: &[IpAddr]) -> Result<()> {
            self.calls.push(format!("rejudge {ips:?}"));
            Ok(())
        }
    }

    pub(super) fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    pub(super) fn key(s: &str) -> PodKey {
        let (namespace, name) = s.split_once('/').unwrap();
        PodKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Ingress from `from` on TCP `port`.
    pub(super) fn only(from: &str, port: u16) -> Allowed {
        Allowed::Only(Table {
            entries: vec![Entry {
                cidr: from.parse().unwrap(),
                ports: PortSet::of([PortRange::new(Protocol::Tcp, port, port)]),
            }],
            peers: BTreeMap::new(),
        })
    }

    pub(super) fn pod(address: &str, ingress: Allowed) -> Result<PodPolicy, PolicyError> {
        let isolated = matches!(ingress, Allowed::Only(_));
        Ok(PodPolicy {
            ips: vec![ip(address)],
            policies: if isolated { vec!["p".into()] } else { vec![] },
            ingress,
            egress: Allowed::All,
        })
    }

    pub(super) fn plan(pods: Vec<(&str, Result<PodPolicy, PolicyError>)>) -> Plan {
        Plan {
            pods: pods.into_iter().map(|(k, r)| (key(k), r)).collect(),
            addresses: BTreeMap::new(),
        }
    }

    pub(super) fn synced(attached: &[&str]) -> PolicySync<Recorder> {
        let sink = Recorder {
            attached: attached.iter().map(|a| ip(a)).collect(),
            ..Recorder::default()
        };
        PolicySync::new(sink, AgentMetrics::default())
    }

    pub(super) fn calls(sync: &mut PolicySync<Recorder>) -> Vec<String> {
        std::mem::take(&mut sync.sink.calls)
    }

    fn rendered(sync: &PolicySync<Recorder>) -> String {
        let datapath = Datapath::with_root(std::path::Path::new("/nonexistent"), "n");
        metrics::render(&metrics::registry(&datapath, &sync.metrics)).unwrap()
    }

    #[test]
    fn only_pods_whose_result_changed_are_written() {
        let mut sync = synced(&["10.0.0.2", "10.0.0.3"]);
        let first = plan(vec![
            ("a/web", pod("10.0.0.2", only("10.1.0.0/16", 80))),
            ("a/db", pod("10.0.0.3", Allowed::All)),
        ]);
        sync.update(first.clone());
        assert_eq!(
            calls(&mut sync),
            [
                "write a/db in=all out=all",
                "write a/web in=10.1.0.0/16:Ranges([PolicyPortRange { protocol: 6, first: 80, last: 80 }]) out=all",
            ]
        );
        // The same plan again (a watch event that changed nothing here).
        sync.update(first);
        assert_eq!(calls(&mut sync), Vec::<String>::new());
        // A policy now isolates db too; web is as before.
        sync.update(plan(vec![
            ("a/web", pod("10.0.0.2", only("10.1.0.0/16", 80))),
            ("a/db", pod("10.0.0.3", only("10.0.0.2/32", 5432))),
        ]));
        let written = calls(&mut sync);
        assert_eq!(written.len(), 1);
        assert!(
            written[0].starts_with("write a/db in=10.0.0.2/32"),
            "{written:?}"
        );
        let text = rendered(&sync);
        assert!(text.contains("flatnet_policy_updates_total 3"), "{text}");
        assert!(
            text.contains("flatnet_policy_isolated_pods{direction=\"ingress\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("flatnet_policy_isolated_pods{direction=\"egress\"} 0"),
            "{text}"
        );
        assert!(text.contains("flatnet_policy_errors_total 0"), "{text}");
    }

    #[test]
    fn a_pod_not_in_the_datapath_yet_is_written_at_the_next_resync() {
        let mut sync = synced(&[]);
        let only_web = plan(vec![("a/web", pod("10.0.0.2", only("10.1.0.0/16", 80)))]);
        sync.update(only_web.clone());
        assert_eq!(calls(&mut sync), Vec::<String>::new());
        assert!(sync.waiting().contains(&key("a/web")));
        // Still not attached at a change elsewhere: it keeps waiting.
        sync.update(only_web);
        assert!(sync.waiting().contains(&key("a/web")));
        // Its ADD finished; the resync writes it and the node's addresses.
        sync.sink.attached.insert(ip("10.0.0.2"));
        sync.resync(&[ip("192.168.1.11"), ip("10.0.0.1")]);
        assert_eq!(calls(&mut sync).len(), 1);
        assert!(sync.waiting().is_empty());
        assert_eq!(sync.sink().local, [ip("192.168.1.11"), ip("10.0.0.1")]);
        // Nothing waits: a resync writes only the addresses.
        sync.resync(&[ip("192.168.1.11")]);
        assert_eq!(calls(&mut sync), Vec::<String>::new());
    }

    #[test]
    fn a_pod_whose_result_fails_keeps_what_it_had() {
        let mut sync = synced(&["10.0.0.2"]);
        sync.update(plan(vec![(
            "a/web",
            pod("10.0.0.2", only("10.1.0.0/16", 80)),
        )]));
        assert_eq!(calls(&mut sync).len(), 1);
        let error = PolicyError::TooManyPortRanges {
            pod: key("a/web"),
            direction: Direction::Ingress,
            peer: "10.1.0.0/16".into(),
            ranges: 17,
            policies: vec!["p".into()],
        };
        sync.update(plan(vec![("a/web", Err(error.clone()))]));
        // Not rewritten, not taken away, not retried.
        assert_eq!(calls(&mut sync), Vec::<String>::new());
        assert!(sync.waiting().is_empty());
        assert!(rendered(&sync).contains("flatnet_policy_errors_total 1"));
        // Computable again: written.
        sync.update(plan(vec![(
            "a/web",
            pod("10.0.0.2", only("10.1.0.0/16", 81)),
        )]));
        assert_eq!(calls(&mut sync).len(), 1);
    }

    #[test]
    fn a_failed_write_is_retried_and_counted() {
        let mut sync = synced(&["10.0.0.2"]);
        sync.sink.failing.insert("a/web".into());
        let p = plan(vec![("a/web", pod("10.0.0.2", only("10.1.0.0/16", 80)))]);
        sync.update(p.clone());
        assert!(sync.waiting().contains(&key("a/web")));
        // Readiness names it.
        let problem = sync.problem().unwrap_or_default();
        assert!(problem.contains("1 pod(s) cannot be written"), "{problem}");
        assert!(
            problem.contains("a/web: invalid setting: a/web: refused"),
            "{problem}"
        );
        sync.sink.failing.clear();
        // The next event, even one that changed nothing for the pod.
        sync.update(p);
        assert_eq!(calls(&mut sync).len(), 1);
        assert!(sync.waiting().is_empty());
        assert_eq!(sync.problem(), None);
        let text = rendered(&sync);
        assert!(text.contains("flatnet_policy_errors_total 1"), "{text}");
        assert!(text.contains("flatnet_policy_updates_total 1"), "{text}");
    }

    #[test]
    fn gone_pods_go_first_and_an_address_taken_over_stays() {
        let mut sync = synced(&["10.0.0.2", "10.0.0.3", "10.0.0.4"]);
        sync.update(plan(vec![
            ("a/old", pod("10.0.0.2", only("10.1.0.0/16", 80))),
            ("a/other", pod("10.0.0.3", only("10.1.0.0/16", 80))),
            ("a/never", pod("10.0.0.9", only("10.1.0.0/16", 80))),
        ]));
        calls(&mut sync);
        // old is gone and a new pod has its address; other is gone too;
        // never was never written: nothing to take away.
        sync.update(plan(vec![(
            "a/new",
            pod("10.0.0.2", only("10.2.0.0/16", 443)),
        )]));
        let done = calls(&mut sync);
        assert_eq!(done.len(), 3, "{done:?}");
        assert_eq!(done[0], "remove a/old []");
        assert_eq!(done[1], "remove a/other [10.0.0.3]");
        assert!(
            done[2].starts_with("write a/new in=10.2.0.0/16"),
            "{done:?}"
        );
        assert!(sync.waiting().is_empty(), "{:?}", sync.waiting());
    }

    #[test]
    fn steps_put_removals_first_and_take_waiting_pods_again() {
        let before = plan(vec![
            ("a/b", pod("10.0.0.2", Allowed::All)),
            ("a/z", pod("10.0.0.3", Allowed::All)),
        ]);
        let after = plan(vec![
            ("a/a", pod("10.0.0.3", Allowed::All)),
            ("a/b", pod("10.0.0.2", Allowed::All)),
        ]);
        let retry = BTreeSet::from([key("a/b")]);
        let steps = steps(&before, &after, &retry);
        let names: Vec<String> = steps
            .iter()
            .map(|s| match s {
                Step::Remove(k) => format!("remove {k}"),
                Step::Write(k, _) => format!("write {k}"),
                Step::Keep(k, _) => format!("keep {k}"),
            })
            .collect();
        assert_eq!(names, ["remove a/z", "write a/a", "write a/b"]);
    }

    #[test]
    fn tables_become_datapath_rules() {
        assert_eq!(rules(&Allowed::All), None);
        let any = Allowed::Only(Table {
            entries: vec![
                Entry {
                    cidr: "0.0.0.0/0".parse().unwrap(),
                    ports: PortSet::Any,
                },
                Entry {
                    cidr: "10.0.0.0/8".parse().unwrap(),
                    ports: PortSet::none(),
                },
                Entry {
                    cidr: "fd00::/64".parse().unwrap(),
                    ports: PortSet::of([PortRange::new(Protocol::Udp, 53, 54)]),
                },
            ],
            peers: BTreeMap::from([(7, PortSet::Any)]),
        });
        assert_eq!(
            datapath::peer_rules(&any),
            [flatnet_datapath::bpf::PeerRule {
                identity: 7,
                ports: PolicyPorts::Any
            }]
        );
        assert!(datapath::peer_rules(&Allowed::All).is_empty());
        let rules = rules(&any).unwrap();
        assert_eq!(rules[0].ports, PolicyPorts::Any);
        assert_eq!(rules[1].ports, PolicyPorts::Ranges(vec![]));
        assert_eq!(
            rules[2].ports,
            PolicyPorts::Ranges(vec![PolicyPortRange {
                protocol: 17,
                first: 53,
                last: 54
            }])
        );
        assert_eq!(
            rules[2].cidr,
            "fd00::/64".parse::<ipnetwork::IpNetwork>().unwrap()
        );
    }
}

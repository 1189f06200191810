//! The incremental pass against a whole one: a cluster changed at random,
//! one object at a time, the index following each change it can (or asking
//! for a whole pass), and after every change the plan it leaves must judge
//! every peer, port and direction of every pod here exactly as a whole pass
//! over the same objects does.

use std::collections::BTreeMap;

use crate::services::EndpointSlice;
use crate::services::Service;
use serde_json::json;

use super::services::{service, slice};
use super::*;
use crate::policy::incremental::PeerIndex;
use crate::policy::tests::rng::Rng;
use crate::services::{Here, frontends};

const APPS: [&str; 4] = ["web", "api", "db", "cache"];
const NAMESPACES: [&str; 3] = ["a", "b", "c"];
/// (protocol, port) every verdict is asked for.
const PORTS: [(u8, u16); 6] = [
    (TCP, 80),
    (TCP, 81),
    (TCP, 8080),
    (UDP, 80),
    (UDP, 53),
    (TCP, 5432),
];

struct World {
    namespaces: Vec<Namespace>,
    pods: BTreeMap<(String, String), Pod>,
    policies: BTreeMap<(String, String), NetworkPolicy>,
    services: Vec<Service>,
    slices: BTreeMap<String, EndpointSlice>,
    /// Every address a pod ever had, and the ClusterIPs: the peers asked.
    peers: Vec<IpAddr>,
    next_ip: u32,
}

fn remote(namespace: &str, name: &str, ip: &str, app: &str) -> Pod {
    pod(namespace, name, &[ip])
        .on("node-2")
        .labels(json!({"app": app}))
        .build()
}

impl World {
    fn new() -> Self {
        let mut world = World {
            namespaces: vec![
                namespace("a", json!({"env": "prod"})),
                namespace("b", json!({"env": "dev"})),
                namespace("c", json!({"env": "prod"})),
            ],
            pods: BTreeMap::new(),
            policies: BTreeMap::new(),
            services: vec![
                service(
                    "c",
                    "cache",
                    &["10.96.0.1"],
                    json!([{"port": 80, "targetPort": 80}]),
                ),
                service(
                    "b",
                    "api",
                    &["10.96.0.2"],
                    json!([{"port": 80, "targetPort": 8080}]),
                ),
            ],
            slices: BTreeMap::new(),
            peers: vec![ip("10.96.0.1"), ip("10.96.0.2"), ip("192.0.2.1")],
            next_ip: 2,
        };
        for (namespace, name, app, address) in [
            ("a", "web-0", "web", "10.0.0.2"),
            ("a", "db-0", "db", "10.0.0.3"),
            ("b", "api-0", "api", "10.0.0.4"),
        ] {
            let local = pod(namespace, name, &[address])
                .labels(json!({"app": app}))
                .build();
            world.pods.insert((namespace.into(), name.into()), local);
            world.peers.push(ip(address));
        }
        for i in 0..12 {
            world.add_remote(NAMESPACES[i % 3], APPS[i % 4], i);
        }
        let policies = [
            (
                "a",
                "deny",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            ),
            (
                "a",
                "web",
                json!({
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                       "podSelector": {"matchLabels": {"app": "api"}}}],
                             "ports": [{"port": 80}, {"port": "serve-81-tcp"}]}]}),
            ),
            (
                "a",
                "db",
                json!({
                "podSelector": {"matchLabels": {"app": "db"}},
                "policyTypes": ["Egress"],
                "egress": [
                    {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cache"}}}],
                     "ports": [{"port": "serve-80-tcp"}]},
                    {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.8/29"]}}],
                     "ports": [{"port": 8080}]}]}),
            ),
            (
                "b",
                "api",
                json!({
                "podSelector": {"matchLabels": {"app": "api"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}]}],
                "egress": [{"ports": [{"port": "serve-80-tcp"}]},
                           {"to": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
            ),
        ];
        for (namespace, name, spec) in policies {
            world.set_policy(namespace, name, Some(spec));
        }
        world.write_slices();
        world
    }

    fn add_remote(&mut self, namespace: &str, app: &str, n: usize) -> (String, String) {
        let address = format!("10.1.{}.{}", self.next_ip / 250, self.next_ip % 250 + 2);
        self.next_ip += 1;
        // Never a name of a pod here; a name already taken is the same
        // pod again, with another address.
        let name = format!("{app}-r{n}");
        self.pods.insert(
            (namespace.into(), name.clone()),
            remote(namespace, &name, &address, app),
        );
        self.peers.push(ip(&address));
        (namespace.into(), name)
    }

    fn set_policy(&mut self, namespace: &str, name: &str, spec: Option<serde_json::Value>) {
        let key = (namespace.to_string(), name.to_string());
        match spec {
            Some(spec) => self.policies.insert(key, policy(namespace, name, spec)),
            None => self.policies.remove(&key),
        };
    }

    /// Each Service's slice: the first three running pods of its app.
    fn write_slices(&mut self) {
        for (namespace, name, app) in [("c", "cache", "cache"), ("b", "api", "api")] {
            let backends: Vec<String> = self
                .pods
                .values()
                .filter(|p| p.labels.get("app").map(String::as_str) == Some(app))
                .filter(|p| p.phase.as_deref() == Some("Running"))
                .filter_map(|p| p.ips.first().map(|i| i.to_string()))
                .take(3)
                .collect();
            let endpoints: Vec<(&str, Option<bool>)> =
                backends.iter().map(|b| (b.as_str(), Some(true))).collect();
            let port = if app == "cache" { 80 } else { 8080 };
            let ports = json!([{"port": port, "protocol": "TCP"}]);
            self.slices
                .insert(name.into(), slice(namespace, name, 1, ports, &endpoints));
        }
    }

    fn whole(&self, numbers: &mut identity::IdentityNumbers) -> (Plan, PeerIndex) {
        let policies: Vec<&NetworkPolicy> = self.policies.values().collect();
        let pods: Vec<&Pod> = self.pods.values().collect();
        let namespaces: Vec<&Namespace> = self.namespaces.iter().collect();
        let services: Vec<&Service> = self.services.iter().collect();
        let slices: Vec<&EndpointSlice> = self.slices.values().collect();
        let here = Here {
            node: NODE,
            zone: None,
        };
        let frontends = frontends(&services, &slices, here);
        plan_indexed(
            NODE,
            (&policies, &pods, &namespaces),
            &frontends,
            &LocalIps::default(),
            numbers,
        )
    }
}

/// One random change, made to `world` and offered to `index`.
fn change(
    world: &mut World,
    index: &mut PeerIndex,
    rng: &mut Rng,
    n: usize,
) -> Result<BTreeMap<IpAddr, Option<u32>>, String> {
    let mut addresses = BTreeMap::new();
    let remotes: Vec<(String, String)> = world
        .pods
        .iter()
        .filter(|(_, p)| p.node_name.as_deref() != Some(NODE))
        .map(|(k, _)| k.clone())
        .collect();
    let pick = |rng: &mut Rng| remotes[rng.below(remotes.len())].clone();
    let pod_key = |(namespace, name): &(String, String)| PodKey {
        namespace: namespace.as_str().into(),
        name: name.as_str().into(),
    };
    let case = rng.below(9);
    let outcome = match case {
        0 | 1 => {
            let key = world.add_remote(NAMESPACES[rng.below(3)], APPS[rng.below(4)], n);
            index.pod_changed(&pod_key(&key), world.pods.get(&key), &mut addresses)
        }
        2 => {
            let key = pick(rng);
            world.pods.remove(&key);
            index.pod_changed(&pod_key(&key), None, &mut addresses)
        }
        3 => {
            let key = pick(rng);
            let app = APPS[rng.below(4)];
            if let Some(p) = world.pods.get_mut(&key) {
                p.labels = pod::labels(BTreeMap::from([("app".into(), app.into())]));
            }
            index.pod_changed(&pod_key(&key), world.pods.get(&key), &mut addresses)
        }
        4 => {
            let key = pick(rng);
            if let Some(p) = world.pods.get_mut(&key) {
                p.phase = Some("Succeeded".into());
            }
            index.pod_changed(&pod_key(&key), world.pods.get(&key), &mut addresses)
        }
        5 => {
            // A policy that may or may not select a pod here.
            let namespace = NAMESPACES[rng.below(3)];
            let app = APPS[rng.below(4)];
            let name = format!("extra-{}", rng.below(4));
            let spec = (rng.below(3) > 0).then(|| {
                json!({
                "podSelector": {"matchLabels": {"app": app}},
                "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 5432}]}]})
            });
            world.set_policy(namespace, &name, spec);
            let key = (namespace.to_string(), name);
            index.policy_changed(&key, world.policies.get(&key))
        }
        6 => {
            // A policy that selects pods here.
            let port = [80, 81, 8080][rng.below(3)];
            world.set_policy("a", "web", Some(json!({
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}], "ports": [{"port": port}]}]})));
            let key = ("a".to_string(), "web".to_string());
            index.policy_changed(&key, world.policies.get(&key))
        }
        _ => {
            world.write_slices();
            let services: Vec<&Service> = world.services.iter().collect();
            let slices: Vec<&EndpointSlice> = world.slices.values().collect();
            let frontends = frontends(
                &services,
                &slices,
                Here {
                    node: NODE,
                    zone: None,
                },
            );
            let keys = [("c", "cache"), ("b", "api")]
                .map(|(namespace, name)| (namespace.to_string(), name.to_string()));
            index.services_changed(&keys.into(), &frontends)
        }
    };
    outcome.map(|()| addresses).map_err(|w| w.0.to_string())
}

fn assert_same_verdicts(followed: &Plan, whole: &Plan, peers: &[IpAddr], step: usize) {
    assert_eq!(
        followed.pods.keys().collect::<Vec<_>>(),
        whole.pods.keys().collect::<Vec<_>>(),
        "step {step}"
    );
    for pod in whole.pods.keys() {
        for direction in [Direction::Ingress, Direction::Egress] {
            for peer in peers {
                for port in PORTS {
                    assert_eq!(
                        followed.allows(pod, direction, *peer, port),
                        whole.allows(pod, direction, *peer, port),
                        "step {step}: {pod} {direction} {peer} {port:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn followed_changes_judge_every_peer_as_a_whole_pass_does() {
    for seed in [1, 7, 2026] {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut world = World::new();
        let mut numbers = identity::IdentityNumbers::default();
        let (mut plan, mut index) = world.whole(&mut numbers);
        let (mut followed, mut whole_passes) = (0, 0);
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for step in 0..300 {
            match change(&mut world, &mut index, &mut rng, step) {
                Ok(addresses) => {
                    followed += 1;
                    for (address, number) in addresses {
                        match number {
                            Some(n) => plan.addresses.insert(address, n),
                            None => plan.addresses.remove(&address),
                        };
                    }
                }
                Err(why) => {
                    whole_passes += 1;
                    *reasons.entry(why).or_default() += 1;
                    (plan, index) = world.whole(&mut numbers);
                }
            }
            let (reference, _) = world.whole(&mut identity::IdentityNumbers::default());
            assert_same_verdicts(&plan, &reference, &world.peers, step);
        }
        println!(
            "seed {seed}: {followed} changes followed, {whole_passes} whole passes: {reasons:?}"
        );
        // Most changes are followed, and the whole passes asked for were
        // each for a reason the test provoked.
        assert!(followed > 150, "{followed} followed: {reasons:?}");
        for reason in [
            "a policy selecting a pod here changed",
            "a peer of an identity not seen before",
        ] {
            assert!(reasons.contains_key(reason), "{reason}: {reasons:?}");
        }
    }
}

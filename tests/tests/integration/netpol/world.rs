//! The cluster, the pods, the stub: the model world (nine pods in namespaces
//! x, y, z over two nodes) the cases run in.

use super::*;

/// Namespace `name` labelled `ns=<name>`, as upstream's model labels them.
pub(super) fn model_namespace(name: &str) -> Value {
    api_namespace(name, json!({"ns": name}))
}

/// Upstream's pod: one container per port and protocol, ports named
/// `serve-<port>-<tcp|udp>`.
pub(super) fn model_pod(pod: &ModelPod) -> Value {
    let containers: Vec<Value> = PORTS
        .iter()
        .flat_map(|port| {
            [Proto::Tcp, Proto::Udp].map(|proto| {
                let lower = proto.api().to_lowercase();
                json!({
                    "name": format!("cont-{port}-{lower}"),
                    "image": "agnhost",
                    "ports": [{"name": format!("serve-{port}-{lower}"), "containerPort": port, "protocol": proto.api()}]
                })
            })
        })
        .collect();
    let labels = json!({"pod": pod.name});
    api_pod(
        pod.namespace,
        pod.name,
        pod.node,
        IpAddr::V4(pod.ip),
        labels,
        json!(containers),
    )
}

/// The model world: the stub (served on each node's loopback), nine pods
/// with their servers. Built on a cluster the test owns.
pub(super) struct World<'c> {
    pub(super) cluster: &'c Cluster,
    pub(super) stub: ApiStub,
    // Dropped in this order: servers first, then the pods (DEL), then the
    // stub's servers.
    _servers: Servers,
    pods: Vec<ModelPod<'c>>,
    _served: Vec<ServedStub>,
    pub(super) ids: Vec<String>,
}

pub(super) fn cluster() -> Cluster {
    let specs: Vec<NodeSpec> = specs(
        &NODES
            .iter()
            .map(|(name, index, cidr)| (*name, *index, Some(*cidr)))
            .collect::<Vec<_>>(),
    );
    Cluster::new(&specs)
}

impl<'c> World<'c> {
    pub(super) fn new(cluster: &'c Cluster) -> Self {
        let stub = ApiStub::from_fixture();
        for namespace in NAMESPACES {
            stub.add(Kind::Namespace, model_namespace(namespace));
        }
        // One stub, served on each node's own loopback, where its agent runs.
        let served = cluster.start_agents_on_api(&stub);
        let mut pods = Vec::new();
        let mut servers = Servers::default();
        for (i, (namespace, name)) in NAMESPACES
            .iter()
            .flat_map(|ns| NAMES.iter().map(move |n| (*ns, *n)))
            .enumerate()
        {
            let node = &cluster.nodes[i % cluster.nodes.len()];
            let sim = node.pod();
            let pod = ModelPod {
                namespace,
                name,
                node: NODES[i % NODES.len()].0,
                ip: sim.ip,
                sim,
            };
            for port in PORTS {
                servers.tcp(pod.netns(), port, pod.id());
                servers.udp(pod.netns(), port, pod.id());
            }
            pods.push(pod);
        }
        let ids = pods.iter().map(ModelPod::id).collect();
        let world = World {
            cluster,
            stub,
            _servers: servers,
            pods,
            _served: served,
            ids,
        };
        world.apply(|stub| {
            for pod in &world.pods {
                stub.add(Kind::Pod, model_pod(pod));
            }
        });
        world
    }

    pub(super) fn pod(&self, id: &str) -> &ModelPod<'c> {
        self.pods.iter().find(|p| p.id() == id).expect("pod")
    }

    pub(super) fn node_of(&self, id: &str) -> &'c SimNode {
        self.cluster.node(self.pod(id).node)
    }

    pub(super) fn metric_of_nodes(&self, series: &str) -> Vec<f64> {
        self.cluster
            .nodes
            .iter()
            .map(|n| metric(&n.metrics(), series).unwrap_or(0.0))
            .collect()
    }

    /// Makes `change` in the stub and waits until both agents have
    /// computed and written it: each node's computation count has grown
    /// and then stayed still for 300 ms (every event of the stub makes a
    /// computation within ~10 ms, and the write follows it in the same
    /// pass); no policy error on either node.
    pub(super) fn apply(&self, change: impl FnOnce(&ApiStub)) {
        let computes = || self.metric_of_nodes("flatnet_policy_compute_seconds_count");
        let before = computes();
        change(&self.stub);
        wait_until("both agents to compute the change", SETTLE, || {
            computes().iter().zip(&before).all(|(now, was)| now > was)
        });
        let mut last = computes();
        // Settled: no further computation within a 300 ms window (the
        // agent coalesces events for 10 ms), the window being the point.
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = computes();
            if now == last {
                break;
            }
            last = now;
        }
        let errors = self.metric_of_nodes("flatnet_policy_errors_total");
        assert!(
            errors.iter().all(|e| *e == 0.0),
            "policy errors on the nodes: {errors:?}\n{}",
            self.logs()
        );
    }

    pub(super) fn logs(&self) -> String {
        self.cluster
            .nodes
            .iter()
            .map(|n| format!("--- agent of {}:\n{}", n.spec.name, n.agent_log()))
            .collect()
    }

    pub(super) fn policy(&self, policy: Value) {
        self.apply(|stub| stub.add(Kind::NetworkPolicy, policy));
    }

    /// Takes every policy away.
    pub(super) fn clear_policies(&self) {
        let keys: Vec<String> = self
            .stub
            .list(Kind::NetworkPolicy)
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap(),
                    p["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        if keys.is_empty() {
            return;
        }
        self.apply(|stub| {
            for key in &keys {
                stub.delete(Kind::NetworkPolicy, key);
            }
        });
    }

    /// Probes all 9x9 pairs of every port and protocol at once (324
    /// threads) and computes the model's tables.
    fn probe_all(&self) -> Vec<Matrix> {
        let cases: Vec<(u16, Proto)> = PORTS
            .iter()
            .flat_map(|port| [(*port, Proto::Tcp), (*port, Proto::Udp)])
            .collect();
        let actual: Vec<Table<Outcome>> = std::thread::scope(|scope| {
            let handles: Vec<Vec<Vec<_>>> = cases
                .iter()
                .map(|&(port, proto)| {
                    self.pods
                        .iter()
                        .map(|from| {
                            self.pods
                                .iter()
                                .map(|to| {
                                    let (netns, ip, id) = (from.netns(), to.ip, to.id());
                                    scope.spawn(move || probe(&netns, ip, port, proto, &id))
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            handles
                .into_iter()
                .map(|table| {
                    table
                        .into_iter()
                        .map(|row| row.into_iter().map(|h| h.join().unwrap()).collect())
                        .collect()
                })
                .collect()
        });
        cases
            .into_iter()
            .zip(actual)
            .map(|((port, proto), actual)| Matrix {
                port,
                proto,
                expected: model(&self.stub, &self.ids, port, proto),
                actual,
            })
            .collect()
    }

    /// Probes everything and compares with the model; panics with the
    /// tables on a mismatch. `must_deny`: the model must expect some
    /// denial (else the case proves nothing). Returns the probe count.
    pub(super) fn check(&self, case: &str, must_deny: bool) -> usize {
        let start = Instant::now();
        let matrices = self.probe_all();
        let expected_denied: usize = matrices
            .iter()
            .map(|m| m.expected.iter().flatten().filter(|a| !**a).count())
            .sum();
        let expected_allowed: usize = matrices
            .iter()
            .map(|m| m.expected.iter().flatten().filter(|a| **a).count())
            .sum();
        let mismatches: usize = matrices.iter().map(Matrix::mismatches).sum();
        let probes = matrices.len() * self.ids.len() * self.ids.len();
        if mismatches > 0 {
            let tables: String = matrices.iter().map(|m| m.render(&self.ids)).collect();
            panic!(
                "case {case:?}: {mismatches} of {probes} probes differ from the model\n{tables}\npolicies: {:#}\n{}",
                Value::Array(self.stub.list(Kind::NetworkPolicy)),
                self.logs()
            );
        }
        assert!(
            expected_allowed > 0,
            "case {case:?}: the model allows nothing"
        );
        if must_deny {
            assert!(
                expected_denied > 0,
                "case {case:?}: the model denies nothing"
            );
        } else {
            assert_eq!(expected_denied, 0, "case {case:?}: the model denies some");
        }
        eprintln!(
            "case {case}: {probes} probes match the model ({expected_allowed} allowed, {expected_denied} denied) in {:.2?}",
            start.elapsed()
        );
        if std::env::var_os("NETPOL_TABLES").is_some() {
            for m in &matrices {
                eprintln!("{}", m.render(&self.ids));
            }
        }
        probes
    }

    /// One policy case from a clean slate: apply, check, clear.
    pub(super) fn case(&self, case: &str, policies: Vec<Value>) {
        self.apply(|stub| {
            for policy in policies {
                stub.add(Kind::NetworkPolicy, policy);
            }
        });
        self.check(case, true);
        self.clear_policies();
    }
}

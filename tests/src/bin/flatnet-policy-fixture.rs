//! `cargo xtask bench`'s NetworkPolicy fixture: puts `count` policies on a
//! benchmark pair of pods, the way flatnet-agent would. The benchmark's
//! own two pods (on the `bench-node` this host stands for) are selected
//! by every policy, isolated for ingress and egress, and each policy
//! allows their traffic (TCP on the unprivileged ports, UDP 5201: iperf3
//! and the ping-pong) besides its own peers (synthetic pods on other nodes,
//! address blocks) on ports of its own, so the pods' tables hold what 100
//! different policies make of them.
//!
//! Stands for the agent's watch loop only: the objects are built here, the
//! plan is the agent's own computation (`flatnet_agent::policy::plan`) and
//! it reaches the maps through the agent's own `PolicySync` and
//! `DatapathSink`, as in a cluster. xtask cannot do this itself: it is
//! built before bpf-linker, which the flatnet library needs.
//!
//! Usage: flatnet-policy-fixture <network> <client-ip> <server-ip> <count>
//! Prints one JSON line: {"policies", "isolated_pods", "rules"}.

use std::net::IpAddr;

use anyhow::{Context, bail, ensure};
use flatnet_agent::metrics::AgentMetrics;
use flatnet_agent::policy::NetworkPolicy;
use flatnet_agent::policy::Pod;
use flatnet_agent::policy::sync::{DatapathSink, PolicySync};
use flatnet_agent::policy::{self, Allowed};
use flatnet_datapath::bpf::Datapath;
use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Value, json};

const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench";
/// Synthetic peers: pods of other nodes, in namespaces of five teams.
const PEER_NAMESPACES: usize = 10;
const PEERS: usize = 200;
const APPS: usize = 20;

fn pod(namespace: &str, name: &str, node: &str, ip: IpAddr, labels: Value) -> Value {
    json!({
        "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{namespace}-{name}"),
                     "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "bench"}]},
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}
    })
}

fn namespace(name: &str, team: usize) -> Value {
    json!({"metadata": {"name": name, "labels": {
        "kubernetes.io/metadata.name": name, "team": format!("team-{team}")
    }}})
}

/// Policy `i`: the benchmark's traffic between the policed pods, and its
/// own peers on its own ports, both ways.
fn network_policy(i: usize) -> Value {
    let bench_peer = json!({"podSelector": {"matchLabels": {"bench": "policed"}}});
    let bench_ports = json!([
        {"protocol": "TCP", "port": 1024, "endPort": 65535},
        {"protocol": "UDP", "port": 5201}
    ]);
    let own_peer = json!({
        "podSelector": {"matchLabels": {"app": format!("app-{}", i % APPS)}},
        "namespaceSelector": {"matchLabels": {"team": format!("team-{}", i % 5)}}
    });
    let own_block = json!({"ipBlock": {
        "cidr": format!("10.250.{}.0/24", i),
        "except": [format!("10.250.{}.128/25", i)]
    }});
    json!({
        "metadata": {"namespace": NAMESPACE, "name": format!("bench-{i}")},
        "spec": {
            "podSelector": {"matchLabels": {"bench": "policed"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [bench_peer], "ports": bench_ports},
                {"from": [own_peer, own_block], "ports": [{"protocol": "TCP", "port": 9000 + i}]}
            ],
            "egress": [
                {"to": [bench_peer], "ports": bench_ports},
                {"to": [own_peer, own_block], "ports": [{"protocol": "TCP", "port": 9000 + i}]}
            ]
        }
    })
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [network, client, server, count] = args.as_slice() else {
        bail!("usage: flatnet-policy-fixture <network> <client-ip> <server-ip> <count>");
    };
    let client: IpAddr = client.parse().context("the client pod's address")?;
    let server: IpAddr = server.parse().context("the server pod's address")?;
    let count: usize = count.parse().context("the number of policies")?;

    let mut namespaces = vec![namespace(NAMESPACE, 0)];
    namespaces.extend((0..PEER_NAMESPACES).map(|n| namespace(&format!("team-ns-{n}"), n % 5)));
    let mut pods = vec![
        pod(
            NAMESPACE,
            "client",
            NODE,
            client,
            json!({"bench": "policed"}),
        ),
        pod(
            NAMESPACE,
            "server",
            NODE,
            server,
            json!({"bench": "policed"}),
        ),
    ];
    pods.extend((0..PEERS).map(|i| {
        let ip = IpAddr::from([10, 251, (i / 200) as u8, (2 + i % 200) as u8]);
        pod(
            &format!("team-ns-{}", i % PEER_NAMESPACES),
            &format!("peer-{i}"),
            &format!("worker-{}", i % 4),
            ip,
            json!({"app": format!("app-{}", i % APPS)}),
        )
    }));
    let policies: Vec<NetworkPolicy> = (0..count)
        .map(|i| serde_json::from_value(network_policy(i)))
        .collect::<Result<_, _>>()?;
    let pods: Vec<Pod> = pods
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()?;
    let namespaces: Vec<Namespace> = namespaces
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()?;

    let plan = policy::plan(NODE, &policies, &pods, &namespaces);
    let mut isolated = 0;
    let mut rules = 0;
    for (pod, result) in &plan.pods {
        let policy = result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{pod}: no policy computed: {e}"))?;
        for allowed in [&policy.ingress, &policy.egress] {
            let Allowed::Only(_) = allowed else {
                bail!("{pod} is not isolated both ways: {policy:?}");
            };
            rules += flatnet_agent::policy::sync::rules(allowed)
                .context("rules of an isolated direction")?
                .len();
        }
        isolated += 1;
    }
    ensure!(isolated == 2, "expected the two benchmark pods in the plan");

    let mut sync = PolicySync::new(
        DatapathSink::new(Datapath::new(network)),
        AgentMetrics::default(),
    );
    sync.update(plan);
    ensure!(
        sync.waiting().is_empty(),
        "pods not written to {network}'s maps: {:?}",
        sync.waiting()
    );
    println!(
        "{}",
        json!({"policies": count, "isolated_pods": isolated, "rules": rules})
    );
    Ok(())
}

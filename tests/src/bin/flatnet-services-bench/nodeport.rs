//! The bench's NodePort part: a client outside the cluster (the simulated
//! underlay's switch namespace, 172.30.0.100) connects to a NodePort on
//! cp-1 whose backend is a pod on worker-1, so the flow is translated both
//! ways and its source becomes cp-1's address, with 10, 1,000 and 10,000
//! NodePort Services installed: through flatnet's uplink program (agents
//! with `--services ebpf` following an API stub, kube-proxy absent) and
//! through kube-proxy's iptables and nftables rules (the kube-proxy
//! fixture's NodePort rules in each node; agents with `--services
//! kube-proxy`). Each path is a two-node cluster of its own; the paths are
//! measured in interleaved slices, medians reported. And one update each:
//! an EndpointSlice change until cp-1's maps hold it (the agent's watch and
//! computation included), against applying kube-proxy's rule set on the two
//! nodes. Then one more eBPF slice with the kernel's BPF statistics on: the
//! time cp-1's programs ran per connection, which bounds what any cheaper
//! translation there could gain. (The kube-proxy clusters run flatnet's
//! datapath with `--services kube-proxy`: worker-1 takes cp-1's TCP flows
//! past its stack in both.)

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flatnet_datapath::bpf::service_key;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::{Cluster, NodeSpec, specs};
use flatnet_tests::kube_stub::{ApiStub, Kind};
use kube_proxy_fixture::{Mode, ServicePort};
use serde_json::{Value, json};

use flatnet_tests::ExchangeServer;

use super::{BACKEND_PORT, MESSAGE, PORT, SLICES, idle_backend, measure, median};

/// NodePort number `i` (kube-proxy's range is a flag; 10,000 NodePorts do
/// not fit in the default 30000-32767).
fn node_port(i: usize) -> u16 {
    20000 + i as u16
}

fn nodes() -> Vec<NodeSpec> {
    specs(&[
        ("cp-1", 1, Some("10.244.0.0/24")),
        ("worker-1", 2, Some("10.244.1.0/24")),
    ])
}

/// `count` NodePort Services (the ClusterIP part's Services, each given a
/// NodePort), the measured one (to `backend`) in the middle; and its
/// NodePort.
fn services(count: usize, backend: SocketAddr) -> (Vec<ServicePort>, u16) {
    let (mut ports, _) = super::services(count, backend);
    for (i, port) in ports.iter_mut().enumerate() {
        port.node_port = Some(node_port(i));
    }
    (ports, node_port(count / 2))
}

/// The API Service of `port`.
fn api_service(port: &ServicePort) -> Value {
    let ip = port.cluster_ip.to_string();
    json!({
        "metadata": {"namespace": port.namespace, "name": port.name},
        "spec": {"type": "NodePort", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": PORT, "protocol": "TCP",
                            "targetPort": BACKEND_PORT, "nodePort": port.node_port}]}
    })
}

/// A Service's EndpointSlice: one ready endpoint on worker-1.
fn api_slice(service: &str, endpoint: SocketAddr) -> Value {
    json!({
        "metadata": {"namespace": NAMESPACE, "name": format!("{service}-1"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": endpoint.port(), "protocol": "TCP"}],
        "endpoints": [{"addresses": [endpoint.ip().to_string()], "nodeName": "worker-1",
                       "conditions": {"ready": true}}]
    })
}

/// Per program pinned for `datapath`: its name, the runs the kernel
/// counted and the run time it charged, in ns (tail-called programs count
/// in their caller's).
fn programs_run(datapath: &flatnet_datapath::bpf::Datapath) -> Vec<(String, u64, u64)> {
    datapath
        .pinned_programs()
        .into_iter()
        .filter_map(|name| {
            let info = aya::programs::ProgramInfo::from_pin(datapath.pin_dir().join(&name)).ok()?;
            Some((name, info.run_count(), info.run_time().as_nanos() as u64))
        })
        .collect()
}

/// Polls `done` every 10 ms for up to `limit`.
fn wait(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while !done() {
        ensure!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The namespace of the ClusterIP part's Services.
const NAMESPACE: &str = "bench";

const PATHS: [&str; 3] = ["ebpf", "iptables", "nftables"];

pub fn run(seconds: f64, counts: &[usize]) -> anyhow::Result<Value> {
    let slice = seconds / SLICES as f64;
    let mut rows = Vec::new();
    let mut updates = Vec::new();
    for &count in counts {
        let cgroup = TestCgroup::new("flatnet-bench-")?;
        let stub = ApiStub::from_fixture();
        let mut ebpf = Cluster::new(&nodes());
        for node in &mut ebpf.nodes {
            node.agent_flags = vec![
                "--services".into(),
                "ebpf".into(),
                "--services-cgroup".into(),
                cgroup.0.display().to_string(),
            ];
        }
        let _served = ebpf.start_agents_on_api(&stub);
        let clusters = [
            ebpf,
            Cluster::started(&nodes(), &[]),
            Cluster::started(&nodes(), &[]),
        ];
        // Per cluster: a pod on cp-1 (its ADD turns forwarding on there, as
        // on any node running pods) and the backend on worker-1.
        let pods: Vec<_> = clusters
            .iter()
            .map(|c| (c.node("cp-1").pod(), c.node("worker-1").pod()))
            .collect();
        let _echoes: Vec<ExchangeServer> = pods
            .iter()
            .map(|(_, b)| ExchangeServer::start(&b.netns, BACKEND_PORT, MESSAGE, 1))
            .collect();
        for cluster in &clusters {
            cluster
                ._switch
                .exec(&["ip", "addr", "add", "172.30.0.100/24", "dev", "br0"]);
        }
        let mut measured_port = 0;
        let mut applied_us = [0.0; 2];
        for (i, cluster) in clusters.iter().enumerate() {
            let backend = SocketAddr::from((pods[i].1.ip, BACKEND_PORT));
            let (ports, measured) = services(count, backend);
            measured_port = measured;
            match i {
                0 => {
                    for port in &ports {
                        stub.add(Kind::Service, api_service(port));
                        stub.add(
                            Kind::EndpointSlice,
                            api_slice(&port.name, port.endpoints[0]),
                        );
                    }
                }
                _ => {
                    let mode = if i == 1 {
                        Mode::Iptables
                    } else {
                        Mode::Nftables
                    };
                    let start = Instant::now();
                    cluster.program_kube_proxy(mode, &ports);
                    applied_us[i - 1] = start.elapsed().as_secs_f64() * 1e6;
                }
            }
        }
        let key = service_key(Ipv4Addr::UNSPECIFIED.into(), measured_port, 6);
        let cp = clusters[0].node("cp-1");
        wait(
            "cp-1's agent to write the NodePorts",
            Duration::from_secs(300),
            || {
                cp.datapath()
                    .service_backends(&key)
                    .ok()
                    .flatten()
                    .is_some_and(|set| set.len() == 1)
                    && cp
                        .datapath()
                        .service_frontends()
                        .is_ok_and(|f| f.len() >= 2 * count)
            },
        )?;
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut p50s: [Vec<f64>; 3] = Default::default();
        let mut p99s: [Vec<f64>; 3] = Default::default();
        let dropped_before = cp.packets(flatnet_common::action::NODEPORT_DROPPED);
        for _ in 0..SLICES {
            for (i, cluster) in clusters.iter().enumerate() {
                let to = SocketAddr::from((cluster.node("cp-1").spec.address(), measured_port));
                let seen = measure(None, &cluster._switch.path(), to, slice)
                    .with_context(|| format!("path {}", PATHS[i]))?;
                rates[i].push(seen["per_second"].as_f64().unwrap_or(f64::NAN));
                p50s[i].push(seen["p50_us"].as_f64().unwrap_or(f64::NAN));
                p99s[i].push(seen["p99_us"].as_f64().unwrap_or(f64::NAN));
            }
        }
        let dropped = cp.packets(flatnet_common::action::NODEPORT_DROPPED) - dropped_before;
        // One more eBPF slice, outside the rates: what the kernel charged
        // cp-1's programs per connection (statistics cost every program a
        // clock read or two, so they stay off while the rates are taken).
        let (bpf_ns_per_connection, per_program) = {
            let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
            let before = programs_run(&cp.datapath());
            let to = SocketAddr::from((cp.spec.address(), measured_port));
            let seen = measure(None, &clusters[0]._switch.path(), to, slice)?;
            let connections = seen["connections"].as_f64().unwrap_or(f64::NAN);
            let mut total_ns = 0;
            let mut per_program = serde_json::Map::new();
            for (name, runs, ns) in programs_run(&cp.datapath()) {
                let (runs_before, ns_before) = before
                    .iter()
                    .find(|(n, ..)| *n == name)
                    .map_or((0, 0), |(_, r, t)| (*r, *t));
                let (runs, ns) = (runs - runs_before, ns - ns_before);
                total_ns += ns;
                if runs > 0 {
                    per_program.insert(
                        name,
                        json!({"runs_per_connection": runs as f64 / connections,
                               "ns_per_run": ns as f64 / runs as f64}),
                    );
                }
            }
            (total_ns as f64 / connections, per_program)
        };
        // One EndpointSlice change: the measured Service's endpoint moved.
        let name = format!("svc-{}", count / 2);
        let moved = idle_backend(count + 1);
        let start = Instant::now();
        stub.modify(
            Kind::EndpointSlice,
            &format!("{NAMESPACE}/{name}-1"),
            |slice| {
                *slice = api_slice(&name, moved);
            },
        );
        wait(
            "cp-1's agent to write the change",
            Duration::from_secs(60),
            || {
                cp.datapath()
                    .service_backends(&key)
                    .ok()
                    .flatten()
                    .is_some_and(|set| {
                        set.iter()
                            .any(|b| flatnet_datapath::bpf::backend_address(b) == moved)
                    })
            },
        )?;
        let agent_update_us = start.elapsed().as_secs_f64() * 1e6;
        for node in &clusters[0].nodes {
            node.stop_agent();
        }
        clusters[0].nodes[0].datapath().detach_services()?;
        let mut row = serde_json::Map::new();
        row.insert("services".into(), json!(count));
        for (i, name) in PATHS.iter().enumerate() {
            row.insert(
                name.to_string(),
                json!({"per_second": median(&mut rates[i]), "p50_us": median(&mut p50s[i]),
                       "p99_us": median(&mut p99s[i]), "slices": SLICES}),
            );
        }
        eprintln!(
            "{count} NodePort Services: {}; update: agent {agent_update_us:.0} us, iptables rules {:.0} us, nftables rules {:.0} us (two nodes)",
            Value::Object(row.clone()),
            applied_us[0],
            applied_us[1],
        );
        row.insert("ebpf_dropped".into(), json!(dropped));
        row.insert(
            "ebpf_cp1_bpf_ns_per_connection".into(),
            json!(bpf_ns_per_connection),
        );
        row.insert("ebpf_cp1_programs".into(), Value::Object(per_program));
        rows.push(Value::Object(row));
        updates.push(
            json!({"services": count, "agent_update_us": agent_update_us,
                            "iptables_apply_us": applied_us[0],
                            "nftables_apply_us": applied_us[1]}),
        );
        drop(pods);
    }
    Ok(json!({"rows": rows, "updates": updates}))
}

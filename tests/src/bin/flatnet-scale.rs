//! `flatnet-scale <size> <idle-secs> <churn-secs> <changes-per-sec>
//! [<kubernetes-bin-dir>]`: one real agent (`--services ebpf`,
//! NetworkPolicy on) on a simulated node with real pods, against an API
//! server holding a synthetic cluster of `size`
//! (`flatnet_tests::scale::objects::SIZES`): the stub, or with a folder
//! holding etcd and kube-apiserver a real one (`scale::real_api`). Idle,
//! then churned, while the node's pods probe an allowed and a denied peer
//! the whole time. Prints one JSON row: what the agent took (memory, CPU,
//! maps), how long changes took to reach its datapath, what it asked of
//! the API server, and the probes' verdicts. `cargo xtask scale` runs it
//! per size.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::{Cluster, SimNode, specs};
use flatnet_tests::kube_stub::{Kind, api_namespace, api_pod};
use flatnet_tests::scale::api::{ScaleApi, now_rfc3339};
use flatnet_tests::scale::churn::Churn;
use flatnet_tests::scale::measure::{self, Buckets};
use flatnet_tests::scale::objects::{self, Size};
use flatnet_tests::{ExchangeServer, Netns, poll_until};
use serde_json::{Value, json};

const NODE: &str = "cp-1";
const PROBE_NAMESPACE: &str = "probe";
const PROBE_PORT: u16 = 8080;
/// How long the agent may take to list the cluster and start.
const START: Duration = Duration::from_secs(900);

fn main() -> anyhow::Result<()> {
    flatnet_tests::remove_on_signal()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (size, idle, churn, rate, kubernetes) = match args.as_slice() {
        [size, idle, churn, rate] => (size, idle, churn, rate, None),
        [size, idle, churn, rate, bin] => (size, idle, churn, rate, Some(bin)),
        _ => bail!(
            "usage: flatnet-scale <size: xs|s|m|l|xl> <idle-secs> <churn-secs> <changes-per-sec> [<kubernetes-bin-dir>]"
        ),
    };
    let size = objects::size_named(size).with_context(|| format!("no size {size}"))?;
    let row = run(
        size,
        Duration::from_secs(idle.parse()?),
        Duration::from_secs(churn.parse()?),
        rate.parse()?,
        kubernetes.map(std::path::Path::new),
    )?;
    println!("{row}");
    Ok(())
}

/// The probe namespace's pods: a client, a server its policy lets the
/// client reach and one it does not; the policies say so, and let in
/// every production namespace's web tier as well (so the tables name
/// peers of the synthetic cluster).
struct Probes<'a> {
    client: flatnet_tests::cluster::SimPod<'a>,
    open: (flatnet_tests::cluster::SimPod<'a>, ExchangeServer),
    closed: (flatnet_tests::cluster::SimPod<'a>, ExchangeServer),
}

impl<'a> Probes<'a> {
    fn start(node: &'a SimNode, api: &ScaleApi) -> anyhow::Result<Self> {
        api.put(
            Kind::Namespace,
            api_namespace(PROBE_NAMESPACE, json!({"env": "prod"})),
        )?;
        api.put(
            Kind::NetworkPolicy,
            json!({"metadata": {"namespace": PROBE_NAMESPACE, "name": "deny"},
                   "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
        )?;
        api.put(
            Kind::NetworkPolicy,
            json!({"metadata": {"namespace": PROBE_NAMESPACE, "name": "to-open"},
                   "spec": {"podSelector": {"matchLabels": {"app": "open"}},
                            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                                   "podSelector": {"matchLabels": {"tier": "web"}}}],
                                         "ports": [{"port": PROBE_PORT}]}]}}),
        )?;
        let pod = |name: &str, labels: Value| -> anyhow::Result<_> {
            let pod = node.pod();
            let ip = IpAddr::V4(pod.ip);
            let containers = json!([{"name": "c", "image": "busybox"}]);
            api.put(
                Kind::Pod,
                api_pod(PROBE_NAMESPACE, name, NODE, ip, labels, containers),
            )?;
            Ok(pod)
        };
        let client = pod("client", json!({"tier": "web"}))?;
        let open = pod("open", json!({"app": "open"}))?;
        let closed = pod("closed", json!({"app": "closed"}))?;
        let serve = |netns: &Netns| ExchangeServer::start(netns, PROBE_PORT, 8, 2);
        let (open_server, closed_server) = (serve(&open.netns), serve(&closed.netns));
        Ok(Probes {
            client,
            open: (open, open_server),
            closed: (closed, closed_server),
        })
    }

    /// Whether the client gets an exchange through to `to` (a denied SYN
    /// is dropped: the connect times out).
    fn reaches(&self, to: &flatnet_tests::cluster::SimPod) -> bool {
        let address = SocketAddr::new(IpAddr::V4(to.ip), PROBE_PORT);
        self.client.netns.run(|| {
            use std::io::{Read, Write};
            let Ok(mut stream) =
                std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500))
            else {
                return false;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
            let mut echoed = [0u8; 8];
            stream.write_all(b"scale-hi").is_ok()
                && stream.read_exact(&mut echoed).is_ok()
                && &echoed == b"scale-hi"
        })
    }

    /// One allowed and one denied probe: how many verdicts were wrong.
    fn wrong(&self) -> u64 {
        u64::from(!self.reaches(&self.open.0)) + u64::from(self.reaches(&self.closed.0))
    }
}

/// Probes run on a thread of their own while `during` runs: (probes,
/// wrong verdicts).
fn probing(probes: &Probes, during: impl FnOnce()) -> (u64, u64) {
    let (stop, count, wrong) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                wrong.fetch_add(probes.wrong(), Ordering::Relaxed);
                count.fetch_add(2, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        during();
        stop.store(true, Ordering::Relaxed);
    });
    (count.into_inner(), wrong.into_inner())
}

/// A histogram's count, p50 and p99 (in ms).
fn quantiles(buckets: &Buckets) -> Value {
    let ms = |q| buckets.quantile(q).map(|s| (s * 1e5).round() / 100.0);
    json!({"count": buckets.count, "p50_ms": ms(0.5), "p99_ms": ms(0.99)})
}

/// The latency histograms' p50 and p99 between two readings, in ms.
fn latencies(before: &str, after: &str) -> Value {
    let read = |name: &str, labels: &str| {
        quantiles(&Buckets::read(after, name, labels).since(&Buckets::read(before, name, labels)))
    };
    let change = "flatnet_change_to_datapath_seconds";
    json!({
        "network_programming": read("flatnet_network_programming_duration_seconds", ""),
        "endpoint_slice_to_maps": read(change, "kind=\"EndpointSlice\""),
        "policy_implementation": read(change, "kind=\"NetworkPolicy\""),
        "pod_to_tables": read(change, "kind=\"Pod\""),
        "plan_compute": read("flatnet_policy_compute_seconds", ""),
        "service_update": read("flatnet_service_update_seconds", ""),
    })
}

fn run(
    size: Size,
    idle: Duration,
    churn_for: Duration,
    rate: f64,
    kubernetes: Option<&std::path::Path>,
) -> anyhow::Result<Value> {
    let cgroup = TestCgroup::new("flatnet-scale-")?;
    let mut cluster = Cluster::new(&specs(&[(NODE, 1, Some("10.244.0.0/24"))]));
    cluster.nodes[0].agent_flags = ["--services", "ebpf", "--services-cgroup"]
        .iter()
        .map(|s| s.to_string())
        .chain([cgroup.0.display().to_string()])
        // The agent's default (the tests' clusters re-check every 2 s).
        .chain(["--resync-secs", "30"].iter().map(|s| s.to_string()))
        .collect();
    let node = &cluster.nodes[0];
    let api = ScaleApi::start(kubernetes, node)?;
    let loading = Instant::now();
    api.load(&size)?;
    let loaded_secs = loading.elapsed().as_secs_f64();

    let starting = Instant::now();
    node.start_agent(&api.peers());
    let ready = poll_until(START, Duration::from_millis(100), || {
        node.ready_marker().exists() && node.conflist_path().exists()
    });
    anyhow::ensure!(
        ready,
        "the agent not ready after {START:?}:\n{}",
        node.agent_log()
    );
    let ready_secs = starting.elapsed().as_secs_f64();
    let pid = node
        .agent
        .lock()
        .map_err(|_| anyhow::anyhow!("agent lock"))?
        .as_ref()
        .map(|child| child.id())
        .context("the agent's process")?;
    let probes = Probes::start(node, &api)?;
    let settled = poll_until(START, Duration::from_millis(200), || probes.wrong() == 0);
    anyhow::ensure!(
        settled,
        "the probes never got their verdicts:\n{}",
        node.agent_log()
    );
    let first_verdicts_secs = starting.elapsed().as_secs_f64();

    let mut idle_cpu = None;
    let (idle_probes, idle_wrong) = probing(&probes, || {
        idle_cpu = measure::cpu_share(pid, || std::thread::sleep(idle));
    });
    let idle_rss = measure::rss_bytes(pid);
    let before = node.metrics();
    let mut churn = Churn::new(size);
    let (mut churn_cpu, mut churned) = (None, Ok(()));
    let (churn_probes, churn_wrong) = probing(&probes, || {
        churn_cpu = measure::cpu_share(pid, || {
            let start = Instant::now();
            while start.elapsed() < churn_for && churned.is_ok() {
                churned = api.apply(churn.next_change(&now_rfc3339()));
                let due = start + Duration::from_secs_f64(churn.changes() as f64 / rate);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
        });
    });
    churned.context("the churn")?;
    // The last changes reach the datapath before the histograms are read.
    std::thread::sleep(Duration::from_secs(2));
    let after = node.metrics();
    let churn_rss = measure::rss_bytes(pid);
    let rss_parts = measure::rss_parts(pid).map(|(anon, file, shared)| {
        json!({"anon_bytes": anon, "file_bytes": file, "shared_bytes": shared})
    });
    Ok(json!({
        "size": size.name, "nodes": size.nodes, "pods": size.pods, "services": size.services,
        "endpoints": size.endpoints(), "policies": size.policies,
        "api": api.name(),
        "loaded_secs": loaded_secs, "ready_secs": ready_secs,
        "first_verdicts_secs": first_verdicts_secs,
        "idle": {"secs": idle.as_secs(), "cpu_share": idle_cpu, "rss_bytes": idle_rss},
        "churn": {"secs": churn_for.as_secs(), "changes": churn.changes(),
                  "rate": churn.changes() as f64 / churn_for.as_secs_f64(),
                  "cpu_share": churn_cpu, "rss_bytes": churn_rss, "rss_parts": rss_parts},
        "map_bytes": measure::map_memory(&node.pin_root),
        "latency": latencies(&before, &after),
        // Every periodic re-check since the start (the default interval).
        "resync": quantiles(&Buckets::read(&after, "flatnet_resync_seconds", "")),
        "requests": api.requests(),
        "probes": {"count": idle_probes + churn_probes, "wrong": idle_wrong + churn_wrong},
    }))
}

//! The agent's life on a node: set the node up once (forwarding, bpffs, the
//! datapath loaded and pinned, binaries installed), then follow the peer
//! source and make the node match each node list (routes, remote-CIDR map,
//! no-masquerade sets, uplink program, conflist), re-checking everything
//! every `--resync-secs`. Readiness is decided afresh at each pass from the
//! node's own setup; a peer whose route cannot be written does not change it.
//! Nothing the datapath needs is torn down on exit: pods keep talking while
//! the agent restarts (`--uninstall` is the way to take it all away).
//!
//! `node` sets the node up and makes it match each node list, `uplink`
//! puts `from_uplink` on the node's uplink, `enforce` keeps NetworkPolicy
//! and eBPF Services in step with the watched objects, `readiness` decides
//! and reports readiness.

mod enforce;
mod incremental;
mod node;
mod pacing;
mod readiness;
mod tunnel;
mod uplink;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::config::{Args, ServicesMode, SourceKind};
use crate::error::{AgentError, Result};
use crate::install::{self};
use crate::metrics::latency::ChangeStamps;
use crate::metrics::{self, AgentMetrics};
use crate::node_state::{network_conf, remove_if_present};
use crate::peers::file_source::FileSource;
use crate::peers::kube_source::{self, KubeSource};
use crate::peers::routes::Routes;
use crate::peers::{Node, PeerSource};
use crate::policy::IsolationByPolicy;
use crate::policy::identity::IdentityNumbers;
use crate::policy::incremental::PeerIndex;
use crate::policy::sync::{DatapathSink, PolicySync};
use crate::policy::watch::{self as policy_watch, PolicyObjects};
use crate::reclaim::Reclaimer;
use crate::services::by_service::DesiredByService;
use crate::services::sync::ServiceSync;
use flatnet::config::NetConf;
use flatnet_datapath::bpf::Datapath;
use flatnet_datapath::netlink::Netlink;
use flatnet_datapath::node::first_packet::isolation_file;
use flatnet_datapath::node::markers as ready;

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: Args) -> Result<()> {
    let node_name = args
        .node_name
        .clone()
        .ok_or_else(|| AgentError::Config("--node-name (NODE_NAME) is required".into()))?;
    let conf = network_conf(&args)?;
    let peer_file =
        match args.peer_source {
            SourceKind::File => Some(args.peer_file.clone().ok_or_else(|| {
                AgentError::Config("--peer-source file needs --peer-file".into())
            })?),
            SourceKind::Kubernetes => None,
        };
    let datapath = Datapath::with_root(&args.pin_root, &args.network);
    // Whatever a previous run said no longer holds until this one checked.
    remove_if_present(&ready::ready_marker(&args.network))?;
    let agent_metrics = AgentMetrics::default();
    let server = metrics::serve(
        args.metrics_addr,
        metrics::registry(&datapath, &agent_metrics),
        agent_metrics.clone(),
    )
    .await?;
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the metrics server stopped");
        }
    });
    let mut agent = Agent::start(args, node_name, conf, datapath, agent_metrics).await?;
    // Back to kube-proxy's Services: the socket programs of an earlier
    // `--services ebpf` run must not keep translating ClusterIPs.
    if agent.args.services == ServicesMode::KubeProxy && agent.datapath.services_attached() {
        agent.datapath.detach_services()?;
        tracing::info!("Service socket programs detached (--services kube-proxy)");
    }

    let (updates, mut nodes_rx) = watch::channel::<Option<Vec<Node>>>(None);
    // Policy changes; None with the file source or --network-policy=false.
    let mut policy_rx = None;
    // ADD's pod records changed; with --network-policy only.
    let mut records_rx = None;
    if !agent.args.network_policy || peer_file.is_some() {
        // No policy enforced here: new pods start open.
        remove_if_present(&isolation_file(&agent.args.network))?;
    }
    match peer_file {
        Some(path) => {
            let poll = Duration::from_millis(agent.args.peer_file_poll_ms.max(10));
            spawn_source(FileSource::new(path, poll), updates, agent.metrics.clone());
        }
        None => {
            let client = kube_source::client(agent.args.kube_api_server.as_deref()).await?;
            let services_ebpf = agent.args.services == ServicesMode::Ebpf;
            if agent.args.network_policy || services_ebpf {
                let stamps = ChangeStamps::new(std::time::SystemTime::now());
                let (objects, changes) =
                    policy_watch::spawn(client.clone(), agent.metrics.clone(), stamps);
                agent.objects = Some(objects);
                policy_rx = Some(changes);
            }
            if agent.args.network_policy {
                let sync = PolicySync::new(
                    DatapathSink::new(agent.datapath.clone()),
                    agent.metrics.clone(),
                );
                // The identities a restarted agent's predecessor wrote are
                // taken up again: nothing in the maps changes meaning.
                let hints = sync.peer_ids().cloned().unwrap_or_default();
                agent.policy = Some(Enforcer {
                    numbers: IdentityNumbers::with_hints(hints.into_iter().collect()),
                    sync,
                    index: None,
                    isolation: IsolationByPolicy::default(),
                });
                records_rx = Some(agent.start_first_packet_policy()?);
            }
            if services_ebpf {
                agent.services = Some(agent.start_services()?);
            }
            spawn_source(KubeSource::new(client), updates, agent.metrics.clone());
        }
    }
    // When gathered changes are due for a pass (`pacing`).
    let mut policy_due: Option<Instant> = None;
    let mut pacing = pacing::Pacing::default();

    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| AgentError::io("installing the SIGTERM handler", e))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| AgentError::io("installing the SIGINT handler", e))?;
    let mut resync =
        tokio::time::interval(Duration::from_secs_f64(agent.args.resync_secs.max(0.01)));
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let outcome = loop {
        tokio::select! {
            changed = nodes_rx.changed() => {
                if changed.is_err() {
                    break Err(AgentError::SourceEnded("the peer source stopped".into()));
                }
                let nodes = nodes_rx.borrow_and_update().clone();
                if let Some(nodes) = nodes {
                    agent.reconcile(&nodes, true).await;
                }
            }
            _ = resync.tick() => {
                let started = Instant::now();
                let nodes = nodes_rx.borrow().clone();
                if let Some(nodes) = nodes {
                    agent.reconcile(&nodes, false).await;
                }
                agent.collect_nat();
                agent.metrics.resync.0.observe(started.elapsed().as_secs_f64());
            }
            changed = policy_change(&mut policy_rx) => {
                if changed.is_err() {
                    break Err(AgentError::SourceEnded("the network policy watches stopped".into()));
                }
                policy_due.get_or_insert_with(|| pacing.due(Instant::now()));
            }
            changed = policy_change(&mut records_rx) => {
                if changed.is_err() {
                    break Err(AgentError::SourceEnded("the pod records watch stopped".into()));
                }
                agent.records_changed = true;
                // Only once the watches have listed (the first value after).
                if policy_rx.as_ref().is_some_and(|rx| *rx.borrow() > 0) {
                    policy_due.get_or_insert_with(|| pacing.due(Instant::now()));
                }
            }
            _ = until(policy_due) => {
                policy_due = None;
                let changes = agent.objects.as_ref().map(|o| o.take_changes());
                let started = Instant::now();
                agent.pass();
                pacing.ran(started, Instant::now());
                if let Some(changes) = changes {
                    let services = agent.services.is_some();
                    agent.metrics.change_latency.observe(changes, services);
                }
            }
            _ = terminate.recv() => break Ok(()),
            _ = interrupt.recv() => break Ok(()),
        }
    };
    // Not ready any more, but everything stays: routes, maps, programs.
    agent.metrics.ready.set(0);
    remove_if_present(&ready::ready_marker(&agent.args.network))?;
    tracing::info!("stopping; the datapath and routes stay in place");
    outcome
}

/// The next policy change; never without policy watches.
async fn policy_change(
    changes: &mut Option<watch::Receiver<u64>>,
) -> std::result::Result<(), watch::error::RecvError> {
    match changes {
        Some(changes) => changes.changed().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `due`; forever without one.
async fn until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
    }
}

/// Feeds each node list of `source` into `updates`; errors are logged and
/// counted, and the last good list stays in force.
fn spawn_source<S: PeerSource>(
    mut source: S,
    updates: watch::Sender<Option<Vec<Node>>>,
    metrics: AgentMetrics,
) {
    tokio::spawn(async move {
        loop {
            match source.changed().await {
                Ok(nodes) => {
                    metrics.peer_updates.inc();
                    if updates.send(Some(nodes)).is_err() {
                        return;
                    }
                }
                Err(AgentError::SourceEnded(reason)) => {
                    tracing::error!(%reason, "the peer source ended");
                    return;
                }
                Err(e) => {
                    metrics.source_errors.inc();
                    tracing::warn!(error = %e, "peer source error; keeping the last node list");
                }
            }
        }
    });
}

/// The node's state as the agent keeps it.
pub struct Agent {
    args: Args,
    node_name: String,
    conf: NetConf,
    datapath: Datapath,
    host: Netlink,
    routes: Routes,
    metrics: AgentMetrics,
    /// What the last reconcile logged as skipped (to log changes only).
    last_skipped: Vec<String>,
    /// Peer routes not in place at the last pass (to log changes only).
    last_missing: Vec<String>,
    /// The readiness last reported (marker, gauge, /readyz).
    ready: bool,
    /// The node's own setup succeeded at the last pass.
    setup_ok: bool,
    /// Without --install-binaries: the installed plugin is another build.
    plugin_problem: Option<String>,
    /// With `--cri-socket`: releases what no sandbox owns any more.
    reclaimer: Option<Reclaimer>,
    /// With the Kubernetes peer source and `--network-policy` or
    /// `--services ebpf`: the watched cluster objects.
    objects: Option<PolicyObjects>,
    /// With `--network-policy` and the Kubernetes peer source.
    policy: Option<Enforcer>,
    /// With `--services ebpf` and the Kubernetes peer source.
    services: Option<ServiceSync>,
    /// The Service and EndpointSlice events the Service maps last
    /// followed (`PolicyObjects::services_generation`).
    services_synced: Option<u64>,
    /// Every node's addresses NodePorts are served on (`--nodeport-addresses`).
    nodeport_addresses: Vec<IpAddr>,
    /// A node list has been received: until then the NodePorts' addresses
    /// are unknown, and a Service sync would take every NodePort a
    /// restarted agent adopted away (its UDP flows and sockets with it).
    nodes_known: bool,
    /// This node's addresses as last written to `NODE_SOURCES`.
    node_sources: Vec<IpAddr>,
    /// This node's `topology.kubernetes.io/zone` (topology hints).
    zone: Option<String>,
    /// ADD recorded a pod since the last pass: the next is a whole one.
    records_changed: bool,
    /// The Service maps' desired state by Service, as last written.
    desired: Option<DesiredByService>,
    /// The nftables generation at which the no-masquerade sets were last
    /// found to hold these CIDRs (`node::sync_no_masquerade`).
    no_masquerade_checked: Option<(u32, Vec<ipnetwork::IpNetwork>)>,
    /// What the remote-CIDR tries were last made to hold (None: the next
    /// pass reads them back; the first, what a predecessor left there).
    remote_written: Option<flatnet_datapath::bpf::RemoteWritten>,
    /// Re-checks since the start (every `FULL_READ_EVERY`th reads the
    /// maps back whole).
    rechecks: u64,
}

/// NetworkPolicy on this node: what was written.
struct Enforcer {
    sync: PolicySync<DatapathSink>,
    /// The peer identities' numbers, kept from one plan to the next.
    numbers: IdentityNumbers,
    /// What the last whole pass saw, for the changes that need none.
    index: Option<PeerIndex>,
    /// Which directions each namespace's policies isolate (for ADD).
    isolation: IsolationByPolicy,
}

/// The node's own addresses as policy sees them: its InternalIPs, and the
/// gateway of each pod CIDR, the source of what the node itself sends to
/// its pods (kubelet's probes).
fn local_addresses(me: &Node) -> Vec<IpAddr> {
    let mut addresses = me.addresses.clone();
    addresses.extend(me.pod_cidrs.iter().filter_map(|c| install::gateway(c).ok()));
    addresses.sort();
    addresses.dedup();
    addresses
}

/// The directory of the running executable (the binaries ship together).
fn own_directory() -> Result<PathBuf> {
    let exe =
        std::env::current_exe().map_err(|e| AgentError::io("finding this program's path", e))?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| AgentError::Config(format!("{} has no directory", exe.display())))
}

/// Where cgroup v2 is mounted (its root holds every process of the node).
fn cgroup2_root() -> Result<PathBuf> {
    flatnet_datapath::util::cgroup2_root()
        .map_err(|e| AgentError::io("reading /proc/self/mounts", e))?
        .ok_or_else(|| {
            AgentError::Config(
                "--services ebpf needs cgroup v2 mounted (none in /proc/self/mounts); set --services-cgroup".into(),
            )
        })
}

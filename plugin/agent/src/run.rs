//! The agent's life: set the node up once (forwarding, bpffs, the datapath
//! loaded and pinned, binaries installed), then follow the peer source and
//! make the node match each node list (routes, remote-CIDR map, no-masquerade
//! sets, uplink program, conflist), re-checking everything every
//! `--resync-secs`. Readiness is decided afresh at each pass from the node's
//! own setup; a peer whose route cannot be written does not change it.
//! Nothing the datapath needs is torn down on exit: pods keep talking while
//! the agent restarts (`--uninstall` is the way to take it all away).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flatnet_common::PROG_FROM_UPLINK;
use ipnetwork::IpNetwork;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use super::config::{Args, ServicesMode, SourceKind};
use super::error::{AgentError, Result};
use super::file_source::FileSource;
use super::install::{self, BINARIES, ConflistSpec};
use super::kube_source::{self, KubeSource};
use super::metrics::{self, AgentMetrics};
use super::peers::{self, Node, PeerSource, Plan};
use super::policy;
use super::policy_sync::{DatapathSink, PolicySync};
use super::policy_watch::{self, PolicyObjects};
use super::reclaim::Reclaimer;
use super::records_watch;
use super::routes::Routes;
use super::service_sync::{self, ServiceSync};
use flatnet::config::NetConf;
use flatnet_datapath::bpf::{
    self, AttachMode, DATAPATH_ID, Datapath, LinkRole, attach_mode, ingress_programs,
};
use flatnet_datapath::masquerade;
use flatnet_datapath::netlink::{Forwarding, IPV6_FORWARD, Netlink, read_sysctl};
use flatnet_datapath::node::ensure_datapath;
use flatnet_datapath::node::first_packet::{Isolation, PodRecord, isolation_file, records_dir};
use flatnet_datapath::node::markers as ready;

/// tc filter priority and handle of `from_uplink` on the uplink: its own
/// slot, so other tc users of the uplink keep theirs, and a restart or an
/// upgrade replaces it in one request.
pub const UPLINK_TC_PRIORITY: u16 = 0xf1a7;
pub const UPLINK_TC_HANDLE: u32 = 0xf1a7;

/// How long policy changes are gathered before the plan is recomputed: a
/// burst of events (a Deployment scaled, a namespace relabelled) costs one
/// computation, and a single change waits at most this long.
const POLICY_COALESCE: Duration = Duration::from_millis(10);

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
                let (objects, changes) =
                    policy_watch::spawn(client.clone(), agent.metrics.clone()).await;
                agent.objects = Some(objects);
                policy_rx = Some(changes);
            }
            if agent.args.network_policy {
                agent.policy = Some(Enforcer {
                    sync: PolicySync::new(
                        DatapathSink::new(agent.datapath.clone()),
                        agent.metrics.clone(),
                    ),
                });
                records_rx = Some(agent.start_first_packet_policy()?);
            }
            if services_ebpf {
                agent.services = Some(agent.start_services()?);
            }
            spawn_source(KubeSource::new(client), updates, agent.metrics.clone());
        }
    }
    // When gathered policy changes are due for a computation.
    let mut policy_due: Option<Instant> = None;

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
                let nodes = nodes_rx.borrow().clone();
                if let Some(nodes) = nodes {
                    agent.reconcile(&nodes, false).await;
                }
            }
            changed = policy_change(&mut policy_rx) => {
                if changed.is_err() {
                    break Err(AgentError::SourceEnded("the network policy watches stopped".into()));
                }
                policy_due.get_or_insert_with(|| Instant::now() + POLICY_COALESCE);
            }
            changed = policy_change(&mut records_rx) => {
                if changed.is_err() {
                    break Err(AgentError::SourceEnded("the pod records watch stopped".into()));
                }
                // Only once the watches have listed (the first value after).
                if policy_rx.as_ref().is_some_and(|rx| *rx.borrow() > 0) {
                    policy_due.get_or_insert_with(|| Instant::now() + POLICY_COALESCE);
                }
            }
            _ = until(policy_due) => {
                policy_due = None;
                agent.enforce_policy();
                agent.sync_services();
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

/// Why the `flatnet` plugin in `bin_dir` cannot serve this agent's network:
/// it is another datapath build (its `--version` says which), so its ADDs
/// are refused there; None when it is this build.
fn plugin_build_problem(bin_dir: &Path) -> Option<String> {
    let plugin = bin_dir.join("flatnet");
    let said = std::process::Command::new(&plugin)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned());
    let build = said.as_deref().and_then(|text| {
        text.split_whitespace()
            .skip_while(|w| *w != "datapath")
            .nth(1)
    });
    match build {
        Some(build) if build == DATAPATH_ID => None,
        Some(build) => Some(format!(
            "the flatnet plugin in {} is datapath build {build}, this agent's is {DATAPATH_ID}: its ADDs are refused on this network until the agent's binaries are installed",
            bin_dir.display()
        )),
        None => Some(format!(
            "{} does not say its datapath build (missing, or older than this agent): ADDs may be refused",
            plugin.display()
        )),
    }
}

/// `isolation-<network>.json` for ADD, written atomically when it changed.
fn write_isolation(network: &str, isolation: &Isolation) -> Result<()> {
    let path = isolation_file(network);
    let bytes = serde_json::to_vec_pretty(isolation)
        .map_err(|e| AgentError::io(format!("encoding {}", path.display()), e.into()))?;
    install::write_atomically(&path, &bytes, 0o644).map(drop)
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

/// The flatnet plugin configuration the agent loads the datapath for
/// (validates the network name and gateway device as the plugin would).
pub(super) fn network_conf(args: &Args) -> Result<NetConf> {
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": args.network,
        "type": "flatnet",
        "bridge": args.bridge,
        "datapath": flatnet_datapath::DatapathMode::from(args.datapath).as_str(),
        "pinRoot": args.pin_root.display().to_string(),
    });
    Ok(NetConf::parse(conf.to_string().as_bytes())?)
}

/// Removes `path`; true when it was there.
pub(super) fn remove_if_present(path: &Path) -> Result<bool> {
    flatnet_datapath::util::remove_file_if_present(path)
        .map_err(|e| AgentError::io(format!("removing {}", path.display()), e))
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
}

/// NetworkPolicy on this node: what was written.
struct Enforcer {
    sync: PolicySync<DatapathSink>,
}

impl Agent {
    /// Everything that does not depend on the node list: forwarding on,
    /// bpffs, the datapath loaded and pinned (so no CNI ADD loads it on a
    /// live node), the network marked as the agent's, binaries installed.
    async fn start(
        args: Args,
        node_name: String,
        conf: NetConf,
        datapath: Datapath,
        metrics: AgentMetrics,
    ) -> Result<Self> {
        tracing::info!(
            node = %node_name,
            network = %args.network,
            pin_dir = %datapath.pin_dir().display(),
            datapath_id = DATAPATH_ID,
            "starting"
        );
        // host-gw forwards pod traffic; the fast path's FIB lookup also
        // refuses to route when forwarding is off.
        Forwarding {
            ipv4: true,
            ipv6: read_sysctl(IPV6_FORWARD).is_some(),
        }
        .ensure()?;
        bpf::ensure_bpffs_at(&args.pin_root)?;
        let host = Netlink::connect()?;
        drop(ensure_datapath(&conf.node_network(), &datapath, &host).await?);
        install::write_atomically(
            &ready::managed_marker(&args.network),
            format!("{node_name}\n").as_bytes(),
            0o644,
        )?;
        if args.install_binaries {
            let from = match &args.install_from {
                Some(dir) => dir.clone(),
                None => own_directory()?,
            };
            let installed = install::install_binaries(&from, &args.cni_bin_dir, &BINARIES)?;
            tracing::info!(
                from = %from.display(),
                to = %args.cni_bin_dir.display(),
                changed = ?installed,
                "plugin binaries installed"
            );
        }
        let installed = install::install_reference_plugins(
            &args.reference_plugins_from,
            &args.cni_bin_dir,
            &install::node_plugins(args.chain_portmap, args.chain_bandwidth),
        )?;
        if !installed.is_empty() {
            tracing::info!(
                from = %args.reference_plugins_from.display(),
                to = %args.cni_bin_dir.display(),
                plugins = ?installed,
                "reference plugins installed"
            );
        }
        let reclaimer = args
            .cri_socket
            .as_ref()
            .map(|socket| Reclaimer::for_node(&args, socket));
        Ok(Agent {
            routes: Routes::connect()?,
            args,
            node_name,
            conf,
            datapath,
            host,
            metrics,
            last_skipped: Vec::new(),
            last_missing: Vec::new(),
            ready: false,
            setup_ok: false,
            plugin_problem: None,
            reclaimer,
            objects: None,
            policy: None,
            services: None,
        })
    }

    /// Makes the node match `nodes`, then reports readiness as the node's
    /// own setup turned out. Failures are logged and retried at the next
    /// resync; `fresh` marks a new list (logged in more detail).
    async fn reconcile(&mut self, nodes: &[Node], fresh: bool) {
        let plan = peers::plan(nodes, &self.node_name);
        if plan.skipped != self.last_skipped {
            for reason in &plan.skipped {
                tracing::warn!(%reason, "peer left out");
            }
            self.last_skipped = plan.skipped.clone();
        }
        self.metrics
            .peer_nodes
            .set(nodes.iter().filter(|n| n.name != self.node_name).count() as i64);
        self.metrics.peer_routes.set(plan.routes.len() as i64);
        if fresh {
            tracing::info!(
                nodes = nodes.len(),
                routes = plan.routes.len(),
                "node list received"
            );
        }
        let outcome = self.sync(&plan).await;
        if let Err(e) = &outcome {
            tracing::warn!(error = %e, "node not (fully) set up; retrying at the next resync");
        }
        self.setup_ok = outcome.is_ok();
        self.plugin_problem = if self.args.install_binaries {
            None
        } else {
            plugin_build_problem(&self.args.cni_bin_dir)
        };
        self.refresh_ready();
        // A leaked address is not the node's setup: readiness stays as is.
        if let (Some(reclaimer), Some(me)) = (self.reclaimer.as_mut(), plan.me.as_ref()) {
            reclaimer.run_pass(&self.metrics, &me.pod_cidrs).await;
        }
        // Policy: the node's addresses, and pods whose ADD was in flight.
        if let (Some(enforcer), Some(me)) = (self.policy.as_mut(), plan.me.as_ref()) {
            enforcer.sync.resync(&local_addresses(me));
        }
    }

    /// Recomputes this node's NetworkPolicy plan from the watched objects
    /// and writes what changed.
    fn enforce_policy(&mut self) {
        if self.policy.is_none() {
            return;
        }
        let local = self.recorded_local_ips();
        let (Some(enforcer), Some(objects)) = (self.policy.as_mut(), self.objects.as_ref()) else {
            return;
        };
        let snapshot = objects.snapshot();
        let policies: Vec<_> = snapshot.policies.iter().map(AsRef::as_ref).collect();
        let pods: Vec<_> = snapshot.pods.iter().map(AsRef::as_ref).collect();
        let namespaces: Vec<_> = snapshot.namespaces.iter().map(AsRef::as_ref).collect();
        let services: Vec<_> = snapshot.services.iter().map(AsRef::as_ref).collect();
        let slices: Vec<_> = snapshot.slices.iter().map(AsRef::as_ref).collect();
        let start = Instant::now();
        let frontends = crate::services::frontends(&services, &slices, &self.node_name);
        let plan = policy::plan_of(
            &self.node_name,
            &policies,
            &pods,
            &namespaces,
            &frontends,
            &local,
        );
        self.metrics
            .policy_compute
            .0
            .observe(start.elapsed().as_secs_f64());
        enforcer.sync.update(plan);
        // Listed (or listed again): readiness may follow at once.
        self.refresh_ready();
        // What ADD starts a new pod with (after the plan: a pod already
        // here is written before its namespace's new policy reaches ADDs).
        let isolation = policy::isolation(&policies);
        if let Err(e) = write_isolation(&self.args.network, &isolation) {
            self.metrics.policy_errors.inc();
            tracing::warn!(error = %e, "cannot write the namespaces' isolation for ADD");
        }
    }

    /// NetworkPolicy from a pod's first packet (`first_packet`): until the
    /// watches have listed, a new pod starts isolated both ways (an earlier
    /// run's file, still in /run, stays in force meanwhile); ADD's pod
    /// records wake the computation.
    fn start_first_packet_policy(&self) -> Result<watch::Receiver<u64>> {
        let network = &self.args.network;
        if !isolation_file(network).exists() {
            write_isolation(network, &Isolation::default())?;
        }
        records_watch::spawn(&records_dir(network))
    }

    /// The addresses ADD recorded for this node's pods, each still in the
    /// datapath (a record a crash left behind names none).
    fn recorded_local_ips(&self) -> policy::LocalIps {
        let mut local = policy::LocalIps {
            node: self.node_name.clone(),
            ..Default::default()
        };
        for (_, record) in PodRecord::read_all(&self.args.network) {
            let attached = record
                .ips
                .iter()
                .any(|ip| self.datapath.slot_of(*ip).is_ok_and(|slot| slot.is_some()));
            if attached {
                local
                    .ips
                    .insert((record.namespace, record.name), record.ips);
            }
        }
        local
    }

    /// `--services ebpf`: the socket programs attached to the cgroup (this
    /// build's replacing any earlier ones without a gap) and the Service
    /// maps as they are adopted.
    fn start_services(&self) -> Result<ServiceSync> {
        let cgroup = match &self.args.services_cgroup {
            Some(dir) => dir.clone(),
            None => cgroup2_root()?,
        };
        self.datapath.attach_services(&cgroup)?;
        tracing::info!(cgroup = %cgroup.display(), "Service socket programs attached");
        Ok(ServiceSync::start(
            self.datapath.clone(),
            self.metrics.clone(),
        )?)
    }

    /// Brings the Service maps up to date with the watched Services and
    /// EndpointSlices.
    fn sync_services(&mut self) {
        let (Some(sync), Some(objects)) = (self.services.as_mut(), self.objects.as_ref()) else {
            return;
        };
        let snapshot = objects.snapshot();
        let services: Vec<_> = snapshot.services.iter().map(AsRef::as_ref).collect();
        let slices: Vec<_> = snapshot.slices.iter().map(AsRef::as_ref).collect();
        let frontends = crate::services::frontends(&services, &slices, &self.node_name);
        sync.update(&service_sync::desired(&frontends));
    }

    /// One pass. An error is this node's own (no datapath, no pod CIDR, no
    /// uplink, conflist or nftables not writable): the node is not ready.
    /// A peer route that is not in place is the peer's problem: logged,
    /// counted, kept out of the fast path, and the pass goes on.
    async fn sync(&mut self, plan: &Plan) -> Result<()> {
        // Cheap when loaded; reloads (and re-attaches pods) after pins were wiped.
        drop(ensure_datapath(&self.conf.node_network(), &self.datapath, &self.host).await?);
        let outcome = self.routes.sync(&plan.routes).await?;
        for cidr in &outcome.written {
            tracing::info!(%cidr, "route to a peer written");
        }
        for cidr in &outcome.removed {
            tracing::info!(%cidr, "stale route removed");
        }
        self.metrics
            .route_failures
            .inc_by(outcome.failures.len() as u64);
        self.metrics
            .peer_routes_missing
            .set(outcome.missing.len() as i64);
        if outcome.missing != self.last_missing {
            for reason in &outcome.missing {
                tracing::warn!(%reason, "route to a peer not in place; retrying at each resync");
            }
            self.last_missing = outcome.missing.clone();
        }
        // Only CIDRs whose route is in place: the fast path forwards by the
        // FIB, which would otherwise send them by whatever route is there.
        let remote: Vec<(IpNetwork, std::net::IpAddr)> =
            outcome.in_place.iter().map(|r| (r.cidr, r.via)).collect();
        self.datapath.set_remote_cidrs(&remote)?;
        self.sync_no_masquerade(plan).await?;

        let Some(me) = &plan.me else {
            return Err(AgentError::Config(format!(
                "node {} is not in the node list",
                self.node_name
            )));
        };
        if me.pod_cidrs.is_empty() {
            return Err(AgentError::Config(format!(
                "node {} has no pod CIDR (kube-controller-manager --allocate-node-cidrs assigns one)",
                me.name
            )));
        }
        let uplink = self.uplink(me).await?;
        self.attach_uplink(uplink).await?;
        let mtu = match self.args.mtu {
            Some(mtu) => Some(mtu),
            None => self.host.link_by_index(uplink).await?.and_then(|l| l.mtu),
        };
        let spec = ConflistSpec {
            network: self.args.network.clone(),
            bridge: self.args.bridge.clone(),
            datapath: self.conf.datapath,
            mtu,
            ip_masq: self.args.ip_masq,
            ipam_data_dir: self.args.ipam_data_dir.clone(),
            pin_root: self.args.pin_root.clone(),
            portmap: self.args.chain_portmap,
            bandwidth: self.args.chain_bandwidth,
        };
        let list = install::render_conflist(&spec, &me.pod_cidrs)?;
        let text = serde_json::to_string_pretty(&list)
            .map_err(|e| AgentError::Config(format!("rendering the conflist: {e}")))?;
        let path = self.args.cni_conf_dir.join(&self.args.conflist_name);
        if install::write_atomically(&path, format!("{text}\n").as_bytes(), 0o644)? {
            tracing::info!(path = %path.display(), cidrs = ?me.pod_cidrs, "conflist written");
        }
        Ok(())
    }

    /// With ipMasq (or rules a pod made under an earlier setting): the
    /// other nodes' pod CIDRs are never masqueraded, whether a packet takes
    /// the fast path or the host stack. All planned peer CIDRs, routed or
    /// not: what matters is that the destination is a pod.
    async fn sync_no_masquerade(&self, plan: &Plan) -> Result<()> {
        let network = self.args.network.clone();
        if !self.args.ip_masq && !masquerade::installed(&network) {
            return Ok(());
        }
        let cidrs: Vec<IpNetwork> = plan.routes.iter().map(|r| r.cidr).collect();
        let count = cidrs.len();
        // nft and the nftables lock block: off the async thread.
        let changed =
            tokio::task::spawn_blocking(move || masquerade::set_unmasqueraded(&network, &cidrs))
                .await
                .map_err(|e| AgentError::Config(format!("the nftables task failed: {e}")))??;
        if changed {
            tracing::info!(cidrs = count, "no-masquerade sets updated");
        }
        Ok(())
    }

    /// Makes the ready marker, `flatnet_agent_ready` and /readyz say
    /// `ready`. The marker goes first when leaving readiness (STATUS is
    /// what stops new pods) and comes first when entering it.
    /// Readiness from the node's setup and the features the agent was
    /// started with: NetworkPolicy or eBPF Services whose watches have not
    /// listed every kind are down (never silently open: new pods start
    /// isolated meanwhile), and the node is not ready, saying why.
    fn refresh_ready(&mut self) {
        let problem = self.objects.as_ref().and_then(PolicyObjects::problem);
        let mut down = Vec::new();
        for (enabled, feature, what) in [
            (self.args.network_policy, "network_policy", "NetworkPolicy"),
            (
                self.args.services == ServicesMode::Ebpf,
                "services_ebpf",
                "Services in eBPF",
            ),
        ] {
            if !enabled || self.objects.is_none() {
                continue;
            }
            self.metrics
                .feature_ready
                .get_or_create(&metrics::FeatureLabel {
                    feature: feature.into(),
                })
                .set(i64::from(problem.is_none()));
            if let Some(problem) = &problem {
                down.push(format!("{what} is not enforced on this node: {problem}"));
            }
        }
        down.extend(self.plugin_problem.clone());
        let mut reasons = down.clone();
        if !self.setup_ok {
            reasons.insert(
                0,
                "the node's setup is not complete (see the agent's log)".into(),
            );
        }
        if let Ok(mut not_ready) = self.metrics.not_ready.lock() {
            *not_ready = reasons;
        }
        self.report_ready(self.setup_ok, &down);
    }

    /// The ready marker and gauge: ready when `setup_ok` and nothing is
    /// `down`; with features down the marker stays, naming them, so CNI
    /// STATUS says which and why.
    fn report_ready(&mut self, setup_ok: bool, down: &[String]) {
        let marker = ready::ready_marker(&self.args.network);
        let ready = setup_ok && down.is_empty();
        if setup_ok {
            if self.ready == ready && marker.exists() && ready {
                return;
            }
            let mut content = serde_json::json!({
                "node": self.node_name,
                "pid": std::process::id(),
                "datapathId": DATAPATH_ID,
            });
            if !down.is_empty() {
                content["down"] = serde_json::json!(down);
            }
            if let Err(e) =
                install::write_atomically(&marker, format!("{content}\n").as_bytes(), 0o644)
            {
                tracing::error!(error = %e, "cannot write the ready marker; not ready");
                self.metrics.ready.set(0);
                self.ready = false;
                return;
            }
            self.metrics.ready.set(i64::from(ready));
            if ready && !self.ready {
                tracing::info!("node ready: CNI STATUS now answers ready");
            }
            if !ready && self.ready {
                tracing::warn!(down = ?down, "node no longer ready: a feature is down");
            }
            self.ready = ready;
        } else {
            if let Err(e) = remove_if_present(&marker) {
                tracing::error!(error = %e, "cannot remove the ready marker");
            }
            self.metrics.ready.set(0);
            if self.ready {
                tracing::warn!(
                    "node no longer ready: CNI STATUS answers 50 until it is set up again"
                );
            }
            self.ready = false;
        }
    }

    /// The uplink's ifindex: `--uplink`, else the interface holding the
    /// node's first address.
    async fn uplink(&self, me: &Node) -> Result<u32> {
        if let Some(name) = &self.args.uplink {
            return self
                .host
                .link_by_name(name)
                .await?
                .map(|link| link.index)
                .ok_or_else(|| AgentError::Config(format!("--uplink {name}: no such interface")));
        }
        for address in &me.addresses {
            if let Some(index) = self.routes.interface_with(*address).await? {
                return Ok(index);
            }
        }
        Err(AgentError::Config(format!(
            "no interface holds any of node {}'s addresses {:?}: pass --uplink",
            me.name, me.addresses
        )))
    }

    /// Puts this build's `from_uplink` at tc ingress of the uplink unless it
    /// is there already: a pinned tcx link (a filter of an older agent taken
    /// off once the link is there), or, without tcx, a cls_bpf filter of its
    /// own priority/handle (create-or-replace: no packet misses a program).
    async fn attach_uplink(&self, index: u32) -> Result<()> {
        let program = self.datapath.program(PROG_FROM_UPLINK)?;
        let id = program.id()?;
        let name = self
            .host
            .link_by_index(index)
            .await?
            .map(|link| link.name)
            .ok_or_else(|| AgentError::Config(format!("the uplink #{index} is gone")))?;
        // In place when this build's program is on the hook the way this
        // kernel attaches (tcx: through the pinned link, no filter of an
        // older agent left).
        let filters = self.host.tc_ingress_programs(index).await?;
        let in_place = match attach_mode() {
            AttachMode::Tcx => {
                filters.iter().all(|(_, n)| n != PROG_FROM_UPLINK)
                    && self.datapath.link_path(LinkRole::Uplink, &name).exists()
                    && ingress_programs(&self.host, index, &name)
                        .await?
                        .iter()
                        .any(|(prog, _)| *prog == id)
            }
            AttachMode::Netlink => filters
                .iter()
                .any(|(prog, n)| *prog == id && n == PROG_FROM_UPLINK),
        };
        if in_place {
            return Ok(());
        }
        match attach_mode() {
            AttachMode::Tcx => {
                self.datapath
                    .attach_tc_link(PROG_FROM_UPLINK, LinkRole::Uplink, &name)?;
                self.host
                    .remove_tc_ingress_bpf(index, UPLINK_TC_PRIORITY, UPLINK_TC_HANDLE)
                    .await?;
            }
            AttachMode::Netlink => {
                self.host.add_clsact(index).await?;
                self.host
                    .set_tc_ingress_bpf(
                        index,
                        program.raw_fd()?,
                        PROG_FROM_UPLINK,
                        UPLINK_TC_PRIORITY,
                        UPLINK_TC_HANDLE,
                    )
                    .await?;
            }
        }
        tracing::info!(
            ifindex = index,
            program_id = id,
            attachment = attach_mode().describe(),
            "from_uplink attached to the uplink"
        );
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A `flatnet` in a folder of its own that prints `version`.
    fn plugin_saying(version: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flatnet");
        std::fs::write(&path, format!("#!/bin/sh\necho '{version}'\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn an_installed_plugin_of_another_build_is_named() {
        let same = plugin_saying(&format!("flatnet 0.1.0 datapath {DATAPATH_ID}"));
        assert_eq!(plugin_build_problem(same.path()), None);
        let other = plugin_saying("flatnet 0.1.0 datapath 0123456789ab");
        let problem = plugin_build_problem(other.path()).expect("another build");
        assert!(
            problem.contains("0123456789ab") && problem.contains(DATAPATH_ID),
            "{problem}"
        );
        let old = plugin_saying("flatnet 0.1.0");
        assert!(plugin_build_problem(old.path()).is_some());
    }
}

//! Setting the node up once, and making it match each node list: routes,
//! the remote-CIDR map, no-masquerade sets, the uplink program, the conflist.

use std::collections::HashSet;

use ipnetwork::IpNetwork;

use crate::config::Args;
use crate::error::{AgentError, Result};
use crate::install::{self, BINARIES, ConflistSpec};
use crate::metrics::AgentMetrics;
use crate::peers::routes::Routes;
use crate::peers::{self, Carrier, Node, Plan, Routing};
use crate::reclaim::Reclaimer;
use flatnet::config::NetConf;
use flatnet_datapath::bpf::{self, DATAPATH_ID, Datapath, RemoteCidr};
use flatnet_datapath::masquerade;
use flatnet_datapath::netlink::{Forwarding, IPV6_FORWARD, Netlink, read_sysctl};
use flatnet_datapath::nft_generation::nftables_generation;
use flatnet_datapath::node::ensure_datapath;
use flatnet_datapath::node::markers as ready;

use super::readiness::plugin_build_problem;
use super::{Agent, local_addresses, own_directory};

/// Every how many re-checks the remote-CIDR maps are read back whole (5
/// minutes at the default 30 s), as kube-proxy's occasional full sync: in
/// between, a pass compares with what it wrote, and a reloaded datapath's
/// maps (new ids) are read back at once.
const FULL_READ_EVERY: u64 = 10;

impl Agent {
    /// Everything that does not depend on the node list: forwarding on,
    /// bpffs, the datapath loaded and pinned (so no CNI ADD loads it on a
    /// live node), the network marked as the agent's, binaries installed.
    pub(super) async fn start(
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
        if args.host_ports_in_bpf().map_err(AgentError::Config)? {
            tracing::info!(
                "hostPorts served in BPF: flatnet declares portMappings, portmap is not chained"
            );
        }
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
            &install::node_plugins(args.chains_portmap(), args.chain_bandwidth),
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
            services_synced: None,
            nodeport_addresses: Vec::new(),
            nodes_known: false,
            node_sources: Vec::new(),
            zone: None,
            records_changed: false,
            desired: None,
            no_masquerade_checked: None,
            remote_written: None,
            rechecks: 0,
        })
    }

    /// Makes the node match `nodes`, then reports readiness as the node's
    /// own setup turned out. Failures are logged and retried at the next
    /// resync; `fresh` marks a new list (logged in more detail).
    pub(super) async fn reconcile(&mut self, nodes: &[Node], fresh: bool) {
        if !fresh {
            self.rechecks += 1;
            if self.rechecks.is_multiple_of(FULL_READ_EVERY) {
                // What was written by hand (bpftool) is put right too.
                self.remote_written = None;
            }
        }
        let routing = match self.routing().await {
            Ok(routing) => routing,
            Err(e) => {
                tracing::warn!(error = %e, "connected subnets unknown: every peer tunnelled");
                Routing {
                    mode: self.args.routing,
                    connected: Vec::new(),
                }
            }
        };
        let plan = peers::plan(nodes, &self.node_name, &routing);
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
        // The source the node's own connections to a ClusterIP whose
        // backend is a local pod keep (see the socket programs).
        let mut sources_changed = false;
        if let Some(me) = plan.me.as_ref()
            && me.addresses != self.node_sources
        {
            match self.datapath.set_node_sources(&me.addresses) {
                Ok(()) => {
                    self.node_sources = me.addresses.clone();
                    sources_changed = true;
                }
                Err(e) => tracing::warn!(error = %e, "cannot write the node's source addresses"),
            }
        }
        // NodePorts follow the nodes' addresses; topology hints, the
        // node's zone.
        let nodeport_addresses =
            crate::services::nodeport_addresses(nodes, &self.args.nodeport_addresses);
        let zone = plan.me.as_ref().and_then(|me| me.zone.clone());
        // (After the node's own addresses: NodePorts tell them apart.)
        let first = !std::mem::replace(&mut self.nodes_known, true);
        if first
            || nodeport_addresses != self.nodeport_addresses
            || zone != self.zone
            || sources_changed
        {
            self.nodeport_addresses = nodeport_addresses;
            self.zone = zone;
            self.sync_services();
            // Policy follows at its next computation, which waits for its
            // watches to have listed: computed now, before they have, it
            // would start new pods open (an_api_server_without_endpoint_
            // slices_v1_leaves_policy_down caught that).
        }
        // Policy: the node's addresses, and pods whose ADD was in flight.
        if let (Some(enforcer), Some(me)) = (self.policy.as_mut(), plan.me.as_ref()) {
            enforcer.sync.resync(&local_addresses(me));
        }
    }

    /// One pass. An error is this node's own (no datapath, no pod CIDR, no
    /// uplink, conflist or nftables not writable): the node is not ready.
    /// A peer route that is not in place is the peer's problem: logged,
    /// counted, kept out of the fast path, and the pass goes on.
    pub(super) async fn sync(&mut self, plan: &Plan) -> Result<()> {
        // Cheap when loaded; reloads (and re-attaches pods) after pins were wiped.
        drop(ensure_datapath(&self.conf.node_network(), &self.datapath, &self.host).await?);
        // Without the device, tunnelled routes are missing (logged below);
        // direct ones still go in.
        self.forget_departed_cidrs(plan)?;
        let tunnel = match self.ensure_tunnel(plan).await {
            Ok(tunnel) => tunnel,
            Err(e) => {
                tracing::warn!(error = %e, "VXLAN device not set up");
                None
            }
        };
        let outcome = self.routes.sync(&plan.routes, tunnel).await?;
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
        // A tunnelled one's route is in place only with the device there;
        // its entry names the tunnel's far end.
        let remote: Vec<RemoteCidr> = outcome
            .in_place
            .iter()
            .map(|r| RemoteCidr {
                cidr: r.cidr,
                node: r.via,
                tunnelled: r.carrier == Carrier::Vxlan,
            })
            .collect();
        let known = self.remote_written.take();
        self.remote_written = Some(self.datapath.sync_remote_cidrs(&remote, known)?);
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
        let mtu = Some(self.pod_mtu(self.uplink_mtu(uplink).await?, me));
        let spec = ConflistSpec {
            cni_versions: self.cni_versions(),
            network: self.args.network.clone(),
            bridge: self.args.bridge.clone(),
            datapath: self.conf.datapath,
            mtu,
            ip_masq: self.args.ip_masq,
            ipam_data_dir: self.args.ipam_data_dir.clone(),
            pin_root: self.args.pin_root.clone(),
            portmap: self.args.chains_portmap(),
            host_ports_in_bpf: self.args.host_ports_in_bpf().unwrap_or(false),
            bandwidth: self.args.chain_bandwidth,
            big_tcp: self.pods_gso_size(uplink).await?,
            map_sizing: self.conf.map_sizing.clone(),
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

    /// A departed peer's CIDR leaves the fast path before its route goes:
    /// an entry without its route would send that CIDR's packets by
    /// whatever route is left (the default one, out of the uplink).
    fn forget_departed_cidrs(&mut self, plan: &Plan) -> Result<()> {
        let planned: HashSet<IpNetwork> = plan
            .routes
            .iter()
            .map(|r| flatnet_datapath::util::normalized(r.cidr))
            .collect();
        // Read back once here when nothing is known; the sync after uses it.
        let mut known = match self.remote_written.take() {
            Some(known) => known,
            None => self.datapath.read_remote()?,
        };
        let departed: Vec<IpNetwork> = known
            .cidrs()
            .filter(|cidr| !planned.contains(cidr))
            .collect();
        // A failure here leaves nothing known: the next pass reads back.
        self.datapath.remove_remote_cidrs(&departed)?;
        known.forget(&departed);
        self.remote_written = Some(known);
        Ok(())
    }

    /// The CNI versions the conflist offers: 1.1.0 only when every chained
    /// reference plugin on the node speaks it (install/versions.rs).
    fn cni_versions(&self) -> Vec<&'static str> {
        let chained = install::chained(self.args.chains_portmap(), self.args.chain_bandwidth);
        let said: Vec<_> = chained
            .iter()
            .map(|name| install::versions::supported_versions(&self.args.cni_bin_dir.join(name)))
            .collect();
        let versions = install::versions::conflist_versions(&said);
        if !versions.contains(&"1.1.0") {
            tracing::info!(
                plugins = ?chained.iter().zip(&said).collect::<Vec<_>>(),
                "a chained plugin does not speak CNI 1.1.0: the conflist offers 1.0.0 only (the runtime then asks no STATUS or GC)"
            );
        }
        versions
    }

    /// With ipMasq (or rules a pod made under an earlier setting): the
    /// other nodes' pod CIDRs are never masqueraded, whether a packet takes
    /// the fast path or the host stack. All planned peer CIDRs, routed or
    /// not: what matters is that the destination is a pod.
    pub(super) async fn sync_no_masquerade(&mut self, plan: &Plan) -> Result<()> {
        let network = self.args.network.clone();
        if !self.args.ip_masq && !masquerade::installed(&network) {
            return Ok(());
        }
        let cidrs: Vec<IpNetwork> = plan.routes.iter().map(|r| r.cidr).collect();
        let count = cidrs.len();
        // Nothing in nftables changed since the sets were found right for
        // these CIDRs: no listing (33 ms at 5,000 nodes).
        let generation = nftables_generation().ok();
        if let (Some(generation), Some((checked, found))) =
            (generation, &self.no_masquerade_checked)
            && generation == *checked
            && cidrs == *found
        {
            return Ok(());
        }
        // nft and the nftables lock block: off the async thread.
        let wanted = cidrs.clone();
        let changed =
            tokio::task::spawn_blocking(move || masquerade::set_unmasqueraded(&network, &wanted))
                .await
                .map_err(|e| AgentError::Config(format!("the nftables task failed: {e}")))??;
        if changed {
            tracing::info!(cidrs = count, "no-masquerade sets updated");
        }
        // Trusted only when found right with nothing changing meanwhile;
        // after a write the next re-check lists them once more.
        self.no_masquerade_checked = match generation {
            Some(before) if !changed && nftables_generation().ok() == Some(before) => {
                Some((before, cidrs))
            }
            _ => None,
        };
        Ok(())
    }
}

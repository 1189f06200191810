//! NetworkPolicy and eBPF Services on this node, kept in step with the
//! watched cluster objects.

use std::time::Instant;

use tokio::sync::watch;

use crate::error::{AgentError, Result};
use crate::install::{self};
use crate::policy;
use crate::policy::incremental::WholePass;
use crate::policy::records_watch;
use crate::services::by_service::DesiredByService;
use crate::services::sync::ServiceSync;
use flatnet_datapath::node::first_packet::{Isolation, PodRecord, isolation_file, records_dir};

use super::{Agent, cgroup2_root};

/// `isolation-<network>.json` for ADD, written atomically when it changed.
pub(super) fn write_isolation(network: &str, isolation: &Isolation) -> Result<()> {
    let path = isolation_file(network);
    let bytes = serde_json::to_vec_pretty(isolation)
        .map_err(|e| AgentError::io(format!("encoding {}", path.display()), e.into()))?;
    install::write_atomically(&path, &bytes, 0o644).map(drop)
}

impl Agent {
    /// One pass over the watched objects (one snapshot, the Services read
    /// once for both): NetworkPolicy recomputed, and the Service maps
    /// brought up to date when a Service or EndpointSlice changed since
    /// they last were (or the last update left a step to retry). Pod and
    /// policy churn, most of a busy cluster's events, do not touch them.
    pub(super) fn pass(&mut self) {
        let Some(objects) = self.objects.as_ref() else {
            return;
        };
        // Read before the objects: they hold at least these.
        let generation = objects.services_generation();
        let changed = objects.take_changed();
        let start = Instant::now();
        // ADD's pod records carry this node's pods' addresses: not
        // followed one by one.
        let records = std::mem::take(&mut self.records_changed);
        let incremental = if records {
            Err(WholePass("a pod record of this node changed"))
        } else {
            self.incremental_pass(&changed, generation, start)
        };
        let Err(WholePass(why)) = incremental else {
            return;
        };
        tracing::debug!(why, "a whole pass");
        let Some(objects) = self.objects.as_ref() else {
            return;
        };
        let snapshot = objects.snapshot();
        let frontends = frontends_of(&snapshot, &self.node_name, self.zone.as_deref());
        self.enforce_policy(&snapshot, &frontends, start);
        let due = self.nodes_known
            && self
                .services
                .as_ref()
                .is_some_and(|sync| self.services_synced != Some(generation) || !sync.settled());
        if due {
            self.sync_services_with(&frontends);
            self.services_synced = Some(generation);
        }
        release_freed_memory();
    }

    /// Recomputes this node's NetworkPolicy plan from `snapshot` and
    /// writes what changed (`start`: when the pass began reading it).
    fn enforce_policy(
        &mut self,
        snapshot: &crate::policy::watch::Snapshot,
        frontends: &[crate::services::Frontend<'_>],
        start: Instant,
    ) {
        if self.policy.is_none() {
            return;
        }
        let local = self.recorded_local_ips();
        let Some(enforcer) = self.policy.as_mut() else {
            return;
        };
        let policies: Vec<_> = snapshot.policies.iter().map(AsRef::as_ref).collect();
        let pods: Vec<_> = snapshot.pods.iter().map(AsRef::as_ref).collect();
        let namespaces: Vec<_> = snapshot.namespaces.iter().map(AsRef::as_ref).collect();
        // The last pass's index and isolation go before the new ones are
        // built: at 150,000 pods the two indexes side by side were 20 MiB
        // more at the pass's peak, which the allocator keeps.
        enforcer.index = None;
        enforcer.isolation = policy::IsolationByPolicy::default();
        let (plan, index) = policy::plan_indexed(
            &self.node_name,
            (&policies, &pods, &namespaces),
            frontends,
            &local,
            &mut enforcer.numbers,
        );
        enforcer.index = Some(index);
        enforcer.isolation = policy::IsolationByPolicy::of(&policies);
        self.metrics
            .policy_compute
            .0
            .observe(start.elapsed().as_secs_f64());
        enforcer.sync.update(plan);
        // What ADD starts a new pod with (written after the plan: a pod
        // already here is written before its namespace's new policy
        // reaches ADDs).
        let isolation = enforcer.isolation.isolation();
        // Listed (or listed again): readiness may follow at once.
        self.refresh_ready();
        if let Err(e) = write_isolation(&self.args.network, &isolation) {
            self.metrics.policy_errors.inc();
            tracing::warn!(error = %e, "cannot write the namespaces' isolation for ADD");
        }
    }

    /// NetworkPolicy from a pod's first packet (`first_packet`): until the
    /// watches have listed, a new pod starts isolated both ways (an earlier
    /// run's file, still in /run, stays in force meanwhile); ADD's pod
    /// records wake the computation.
    pub(super) fn start_first_packet_policy(&self) -> Result<watch::Receiver<u64>> {
        let network = &self.args.network;
        if !isolation_file(network).exists() {
            write_isolation(network, &Isolation::default())?;
        }
        records_watch::spawn(&records_dir(network))
    }

    /// The addresses ADD recorded for this node's pods, each still in the
    /// datapath (a record a crash left behind names none).
    pub(super) fn recorded_local_ips(&self) -> policy::LocalIps {
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
    pub(super) fn start_services(&self) -> Result<ServiceSync> {
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

    /// `--services ebpf`: forgets the uplink's translated flows that went
    /// idle, and lets go of the ports held for flows that ended.
    pub(super) fn collect_nat(&mut self) {
        if let Some(sync) = self.services.as_mut() {
            crate::services::nat::collect(&self.datapath, &self.metrics);
            if sync.holds_ports() {
                sync.release_ports();
            }
        }
    }

    /// Brings the Service maps up to date with the watched Services and
    /// EndpointSlices now (the node's addresses or zone changed). Not before
    /// every watch has listed: stores still filling would make a restarted
    /// agent delete the frontends it adopted, and destroy their clients'
    /// sockets and UDP flows, until the lists are in. The first pass after
    /// them syncs with the addresses of then.
    pub(super) fn sync_services(&mut self) {
        let Some(objects) = self.objects.as_ref() else {
            return;
        };
        if objects.problem().is_some() || !self.nodes_known {
            return;
        }
        let generation = objects.services_generation();
        let snapshot = objects.snapshot();
        let frontends = frontends_of(&snapshot, &self.node_name, self.zone.as_deref());
        self.sync_services_with(&frontends);
        self.services_synced = Some(generation);
    }

    pub(super) fn sync_services_with(&mut self, frontends: &[crate::services::Frontend<'_>]) {
        let Some(sync) = self.services.as_mut() else {
            return;
        };
        let desired = DesiredByService::of(frontends, &self.nodeport_addresses);
        sync.health.update(desired.checks());
        sync.update(
            desired.desired(),
            &self.nodeport_addresses,
            &self.node_sources,
        );
        self.desired = Some(desired);
    }
}

/// The Services of `snapshot` as this node sees them (its name for
/// `internalTrafficPolicy: Local`, its zone for topology hints).
fn frontends_of<'a>(
    snapshot: &'a crate::policy::watch::Snapshot,
    node: &str,
    zone: Option<&str>,
) -> Vec<crate::services::Frontend<'a>> {
    let services: Vec<_> = snapshot.services.iter().map(AsRef::as_ref).collect();
    let slices: Vec<_> = snapshot.slices.iter().map(AsRef::as_ref).collect();
    crate::services::frontends(&services, &slices, crate::services::Here { node, zone })
}

/// Gives the memory a whole pass freed back to the system. A whole pass
/// over a large cluster builds and drops hundreds of MiB of temporaries;
/// the allocator keeps the freed pages in its arenas otherwise, and the
/// agent's resident memory (what a node's operator sees) stays at the
/// pass's peak for good.
fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free pages to the kernel; it reads
    // and writes no memory the program holds.
    unsafe {
        libc::malloc_trim(0);
    }
}

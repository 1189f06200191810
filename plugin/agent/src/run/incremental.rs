//! A pass that follows the objects changed since the last one instead of
//! reading them all (`policy::incremental`): remote pods, NetworkPolicies
//! that select no pod here, and Services whose ClusterIP verdicts stay, as
//! most of a busy cluster's events are. Whatever it cannot follow makes
//! the caller run a whole pass.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::policy::PodKey;
use crate::policy::changes::Changed;
use crate::policy::incremental::WholePass;

use super::Agent;
use super::enforce::write_isolation;
use crate::services::Here;

impl Agent {
    /// Follows `changed`; Err: a whole pass is needed (nothing the datapath
    /// holds has been changed then, but the index may have been: the whole
    /// pass makes a new one).
    pub(super) fn incremental_pass(
        &mut self,
        changed: &Changed,
        generation: u64,
        start: Instant,
    ) -> Result<(), WholePass> {
        // The stores, shared: the Agent stays free to change.
        let Some(objects) = self.objects.clone() else {
            return Ok(());
        };
        if changed.whole {
            return Err(WholePass("a list or a namespace changed"));
        }
        // The changed Services' frontends alone, from their slices.
        let services: Vec<_> = changed
            .services
            .iter()
            .filter_map(|key| objects.service(key))
            .collect();
        let slices = if changed.services.is_empty() {
            Vec::new()
        } else {
            objects.slices_of(&changed.services)
        };
        let service_refs: Vec<_> = services.iter().map(AsRef::as_ref).collect();
        let slice_refs: Vec<_> = slices.iter().map(AsRef::as_ref).collect();
        let here = Here {
            node: &self.node_name,
            zone: self.zone.as_deref(),
        };
        let frontends = crate::services::frontends(&service_refs, &slice_refs, here);
        if let Some(enforcer) = self.policy.as_mut() {
            let Some(index) = enforcer.index.as_mut() else {
                return Err(WholePass("no whole pass yet"));
            };
            if !changed.services.is_empty() {
                index.services_changed(&changed.services, &frontends)?;
            }
            for key in &changed.policies {
                index.policy_changed(key, objects.policy(key).as_deref())?;
            }
            let mut addresses = BTreeMap::new();
            for changed_pod in &changed.pods {
                let pod = objects.pod(changed_pod);
                let (namespace, name) = changed_pod;
                let key = PodKey {
                    namespace: namespace.as_str().into(),
                    name: name.as_str().into(),
                };
                index.pod_changed(&key, pod.as_deref(), &mut addresses)?;
            }
            enforcer.sync.update_addresses(&addresses);
            let mut isolation_changed = false;
            for key in &changed.policies {
                let policy = objects.policy(key);
                isolation_changed |= enforcer.isolation.set(key.clone(), policy.as_deref());
            }
            if isolation_changed {
                let isolation = enforcer.isolation.isolation();
                if let Err(e) = write_isolation(&self.args.network, &isolation) {
                    self.metrics.policy_errors.inc();
                    tracing::warn!(error = %e, "cannot write the namespaces' isolation for ADD");
                }
            }
            self.metrics
                .policy_compute
                .0
                .observe(start.elapsed().as_secs_f64());
            self.refresh_ready();
        }
        self.follow_services(&changed.services, &frontends, generation);
        Ok(())
    }

    /// The Service maps after the Services `keys` became `frontends`
    /// (those that have one): their part of the desired state replaced,
    /// the maps brought to it. All Services computed again when the state
    /// cannot be replaced one Service at a time.
    fn follow_services(
        &mut self,
        keys: &BTreeSet<(String, String)>,
        frontends: &[crate::services::Frontend<'_>],
        generation: u64,
    ) {
        let due = self.nodes_known
            && self
                .services
                .as_ref()
                .is_some_and(|sync| self.services_synced != Some(generation) || !sync.settled());
        if !due {
            return;
        }
        let addresses = self.nodeport_addresses.clone();
        let mut touched = BTreeSet::new();
        let replaced = self.desired.as_mut().is_some_and(|desired| {
            keys.iter().all(|key| {
                let frontend = frontends
                    .iter()
                    .find(|f| f.namespace == key.0 && f.name == key.1);
                desired
                    .replace(key.clone(), frontend, &addresses, &mut touched)
                    .is_ok()
            })
        });
        if !replaced {
            self.sync_services();
            return;
        }
        if let (Some(sync), Some(desired)) = (self.services.as_mut(), self.desired.as_ref()) {
            sync.health.update(desired.checks());
            let own = &self.node_sources;
            sync.update_touched(desired.desired(), &touched, &addresses, own);
        }
        self.services_synced = Some(generation);
    }
}

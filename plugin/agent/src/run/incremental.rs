//! A pass that follows the objects changed since the last one instead of
//! reading them all (`policy::incremental`): remote pods, NetworkPolicies
//! that select no pod here, and Services whose ClusterIP verdicts stay, as
//! most of a busy cluster's events are. Whatever it cannot follow makes
//! the caller run a whole pass.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::policy::PodKey;
use crate::policy::incremental::WholePass;
use crate::policy::watch::Changed;

use super::Agent;
use super::enforce::{frontends_of, write_isolation};

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
        let snapshot = changed.services.then(|| objects.service_snapshot());
        let frontends = snapshot
            .as_ref()
            .map(|s| frontends_of(s, &self.node_name, self.zone.as_deref()));
        if let Some(enforcer) = self.policy.as_mut() {
            let Some(index) = enforcer.index.as_mut() else {
                return Err(WholePass("no whole pass yet"));
            };
            if let Some(frontends) = &frontends {
                index.services_changed(frontends)?;
            }
            for key in &changed.policies {
                index.policy_changed(key, objects.policy(key).as_deref())?;
            }
            let mut addresses = BTreeMap::new();
            for (namespace, name) in &changed.pods {
                let key = PodKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                let pod = objects.pod(&(key.namespace.clone(), key.name.clone()));
                index.pod_changed(&key, pod.as_deref(), &mut addresses)?;
            }
            enforcer.sync.update_addresses(&addresses);
            if !changed.policies.is_empty() {
                let before = enforcer.isolation.isolation();
                for key in &changed.policies {
                    let policy = objects.policy(key);
                    enforcer.isolation.set(key.clone(), policy.as_deref());
                }
                let after = enforcer.isolation.isolation();
                if after != before
                    && let Err(e) = write_isolation(&self.args.network, &after)
                {
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
        let due = self
            .services
            .as_ref()
            .is_some_and(|sync| self.services_synced != Some(generation) || !sync.settled());
        if due {
            match &frontends {
                Some(frontends) => self.sync_services_with(frontends),
                None => {
                    let snapshot = objects.service_snapshot();
                    let zone = self.zone.clone();
                    let frontends = frontends_of(&snapshot, &self.node_name, zone.as_deref());
                    self.sync_services_with(&frontends);
                }
            }
            self.services_synced = Some(generation);
        }
        Ok(())
    }
}

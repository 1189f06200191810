//! How full the policy maps are, from what the agent wrote: it is their
//! only writer, so its own count is exact and costs no walk of a map.

use std::net::IpAddr;

use flatnet_common::{MAX_PEER_IDS, MAX_POLICY_ENTRIES, MAX_POLICY_PEERS};
use ipnetwork::IpNetwork;

use super::{PolicySink, PolicySync};
use crate::metrics::MapLabel;
use crate::policy::{Allowed, Plan};

/// Entries of each policy map: (name, entries, capacity).
pub fn entries(
    plan: &Plan,
    written: impl Fn(&crate::policy::PodKey) -> bool,
    peer_ids: impl Iterator<Item = IpAddr>,
) -> [(&'static str, usize, u32); 5] {
    let (mut v4, mut v6, mut peers) = (0, 0, 0);
    for (key, result) in &plan.pods {
        let Ok(policy) = result else { continue };
        if !written(key) {
            continue;
        }
        for allowed in [&policy.ingress, &policy.egress] {
            let Allowed::Only(table) = allowed else {
                continue;
            };
            for entry in &table.entries {
                match entry.cidr {
                    IpNetwork::V4(_) => v4 += 1,
                    IpNetwork::V6(_) => v6 += 1,
                }
            }
            peers += table.peers.len();
        }
    }
    let (mut ids_v4, mut ids_v6) = (0, 0);
    for address in peer_ids {
        if address.is_ipv4() {
            ids_v4 += 1;
        } else {
            ids_v6 += 1;
        }
    }
    [
        ("POLICY_V4", v4, MAX_POLICY_ENTRIES),
        ("POLICY_V6", v6, MAX_POLICY_ENTRIES),
        ("POLICY_PEERS", peers, MAX_POLICY_PEERS),
        ("PEER_IDS_V4", ids_v4, MAX_PEER_IDS),
        ("PEER_IDS_V6", ids_v6, MAX_PEER_IDS),
    ]
}

impl<S: PolicySink> PolicySync<S> {
    /// Sets `flatnet_bpf_map_pressure` for the policy maps.
    pub(super) fn report_pressure(&mut self, plan: &Plan) {
        let peer_ids = self.peer_ids.iter().flat_map(|ids| ids.keys().copied());
        let written = |key: &crate::policy::PodKey| {
            self.written.contains_key(key) && !self.failures.contains_key(key)
        };
        let counted = entries(plan, written, peer_ids);
        for (map, count, built_in) in counted {
            let capacity = self.sink.capacity(map).unwrap_or(built_in);
            let label = MapLabel { map: map.into() };
            let gauge = self.metrics.map_pressure.get_or_create(&label);
            gauge.set(count as f64 / f64::from(capacity));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::policy::PortSet;
    use crate::policy::sync::tests::{ip, only, plan, pod};

    #[test]
    fn entries_count_what_was_written_per_map() {
        let mut allowed = only("10.1.0.0/16", 80);
        if let Allowed::Only(table) = &mut allowed {
            table.peers = BTreeMap::from([(7, PortSet::Any), (8, PortSet::Any)]);
        }
        let plan = plan(vec![
            ("a/web", pod("10.0.0.2", allowed.clone())),
            ("a/new", pod("10.0.0.3", allowed)),
        ]);
        let ids = [ip("10.1.0.5"), ip("10.1.0.6"), ip("fd00::5")];
        let counted = entries(&plan, |k| &*k.name == "web", ids.into_iter());
        assert_eq!(
            counted.map(|(map, n, _)| (map, n)),
            [
                ("POLICY_V4", 1),
                ("POLICY_V6", 0),
                ("POLICY_PEERS", 2),
                ("PEER_IDS_V4", 2),
                ("PEER_IDS_V6", 1),
            ]
        );
    }
}

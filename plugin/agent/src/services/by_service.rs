//! The Service maps' desired state kept per Service: one Service's change
//! (an EndpointSlice rewritten as a pod comes or goes, most of a busy
//! cluster's Service events) recomputes its frontend alone and replaces
//! its part, instead of every Service's frontend being computed again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use super::Frontend;
use super::health::HealthCheck;
use super::plan::{FrontendKey, Target, desired};

/// A Service's namespace and name.
pub type ServiceKey = (String, String);

/// Why the state cannot be changed one Service at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision;

/// [`desired`] and the health checks of every Service, by Service.
#[derive(Debug, Default)]
pub struct DesiredByService {
    desired: BTreeMap<FrontendKey, Target>,
    /// Each Service's frontend keys, and each key's Service.
    keys: HashMap<ServiceKey, Vec<FrontendKey>>,
    owners: HashMap<FrontendKey, ServiceKey>,
    checks: HashMap<ServiceKey, (u16, HealthCheck)>,
    /// Two Services put the same key (externalIPs shared on one port):
    /// which one wins depends on their order, so none is replaced alone.
    collided: bool,
}

impl DesiredByService {
    /// The state of `frontends`, NodePorts on `node_addresses`' families.
    pub fn of(frontends: &[Frontend<'_>], node_addresses: &[IpAddr]) -> Self {
        let mut by_service = DesiredByService::default();
        for frontend in frontends {
            let key = (frontend.namespace.to_string(), frontend.name.to_string());
            if by_service.put(key, Some(frontend), node_addresses).is_err() {
                by_service.collided = true;
            }
        }
        by_service
    }

    /// Service `key`'s frontend is now `frontend` (None: it has none); the
    /// frontend keys it had or has (the others are as they were) are added
    /// to `touched`.
    pub fn replace(
        &mut self,
        key: ServiceKey,
        frontend: Option<&Frontend<'_>>,
        node_addresses: &[IpAddr],
        touched: &mut BTreeSet<FrontendKey>,
    ) -> Result<(), Collision> {
        if self.collided {
            return Err(Collision);
        }
        touched.extend(self.keys.get(&key).into_iter().flatten().copied());
        let replaced = self.put(key.clone(), frontend, node_addresses);
        touched.extend(self.keys.get(&key).into_iter().flatten().copied());
        replaced
    }

    fn put(
        &mut self,
        key: ServiceKey,
        frontend: Option<&Frontend<'_>>,
        node_addresses: &[IpAddr],
    ) -> Result<(), Collision> {
        for old in self.keys.remove(&key).unwrap_or_default() {
            self.desired.remove(&old);
            self.owners.remove(&old);
        }
        self.checks.remove(&key);
        let Some(frontend) = frontend else {
            return Ok(());
        };
        let mut collided = false;
        let mine = desired(std::slice::from_ref(frontend), node_addresses);
        let keys: Vec<FrontendKey> = mine.keys().copied().collect();
        for (frontend_key, target) in mine {
            if let Some(other) = self.owners.insert(frontend_key, key.clone())
                && other != key
            {
                collided = true;
            }
            self.desired.insert(frontend_key, target);
        }
        self.keys.insert(key.clone(), keys);
        if let Some((port, check)) = super::health::checks(std::slice::from_ref(frontend))
            .into_iter()
            .next()
        {
            self.checks.insert(key, (port, check));
        }
        if collided { Err(Collision) } else { Ok(()) }
    }

    pub fn desired(&self) -> &BTreeMap<FrontendKey, Target> {
        &self.desired
    }

    /// The health checks by port, as `health::checks` gives them.
    pub fn checks(&self) -> BTreeMap<u16, HealthCheck> {
        self.checks.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::services::EndpointSlice;
    use crate::services::Service;
    use serde_json::{Value, json};

    use super::*;
    use crate::services::health::checks;
    use crate::services::plan::{Scope, departed, steps};
    use crate::services::{Here, frontends};

    fn service(name: &str, spec: Value) -> Service {
        serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": name}, "spec": spec}))
            .unwrap()
    }

    fn slice(service: &str, addresses: &[&str]) -> EndpointSlice {
        let endpoints: Vec<Value> = addresses
            .iter()
            .map(|a| json!({"addresses": [a], "conditions": {"ready": true}, "nodeName": "node-1"}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": format!("{service}-1"),
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints
        }))
        .unwrap()
    }

    fn services(shared_external_ip: &str) -> Vec<Service> {
        vec![
            service(
                "a",
                json!({"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                                "ports": [{"port": 80, "targetPort": 8080}]}),
            ),
            service(
                "b",
                json!({"type": "NodePort", "clusterIP": "10.96.0.2",
                                "clusterIPs": ["10.96.0.2"], "externalIPs": ["192.0.2.9"],
                                "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}]}),
            ),
            service(
                "c",
                json!({"type": "LoadBalancer", "clusterIP": "10.96.0.3",
                                "clusterIPs": ["10.96.0.3"], "externalTrafficPolicy": "Local",
                                "healthCheckNodePort": 32000, "externalIPs": [shared_external_ip],
                                "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30081}]}),
            ),
        ]
    }

    fn both(services: &[Service], slices: &[EndpointSlice], nodes: &[IpAddr]) -> DesiredByService {
        let services: Vec<&Service> = services.iter().collect();
        let slices: Vec<&EndpointSlice> = slices.iter().collect();
        let all = frontends(
            &services,
            &slices,
            Here {
                node: "node-1",
                zone: None,
            },
        );
        let by_service = DesiredByService::of(&all, nodes);
        assert_eq!(by_service.desired(), &desired(&all, nodes));
        assert_eq!(by_service.checks(), checks(&all));
        by_service
    }

    #[test]
    fn replacing_one_service_gives_what_all_of_them_computed_again_give() {
        let nodes = ["172.16.0.1".parse().unwrap()];
        let services = services("192.0.2.10");
        let mut slices = vec![
            slice("a", &["10.1.0.1", "10.1.0.2"]),
            slice("b", &["10.1.0.3"]),
            slice("c", &["10.1.0.4"]),
        ];
        let mut by_service = both(&services, &slices, &nodes);
        // b loses its backend, c gains one, a goes.
        slices[1] = slice("b", &[]);
        slices[2] = slice("c", &["10.1.0.4", "10.1.0.5"]);
        let now = both(&services[1..], &slices, &nodes);
        let refs: Vec<&Service> = services[1..].iter().collect();
        let slice_refs: Vec<&EndpointSlice> = slices.iter().collect();
        let changed = frontends(
            &refs,
            &slice_refs,
            Here {
                node: "node-1",
                zone: None,
            },
        );
        let before = by_service.desired().clone();
        let mut touched = BTreeSet::new();
        for (name, frontend) in [
            ("a", None),
            ("b", Some(&changed[0])),
            ("c", Some(&changed[1])),
        ] {
            let key = ("ns".to_string(), name.to_string());
            by_service
                .replace(key, frontend, &nodes, &mut touched)
                .unwrap();
        }
        assert_eq!(by_service.desired(), now.desired());
        assert_eq!(by_service.checks(), now.checks());
        // The touched frontends hold every difference: comparing them
        // alone finds what comparing all finds.
        let after = by_service.desired();
        assert!(!steps(&before, after, Scope::All).is_empty());
        assert_eq!(
            steps(&before, after, Scope::Keys(&touched)),
            steps(&before, after, Scope::All)
        );
        assert_eq!(
            departed(&before, after, Scope::Keys(&touched)),
            departed(&before, after, Scope::All)
        );
    }

    #[test]
    fn services_sharing_a_frontend_are_never_replaced_one_at_a_time() {
        let nodes = ["172.16.0.1".parse().unwrap()];
        // c's externalIP is b's, on the same port.
        let services = services("192.0.2.9");
        let slices = [slice("b", &["10.1.0.3"]), slice("c", &["10.1.0.4"])];
        let mut by_service = both(&services, &slices, &nodes);
        let key = ("ns".to_string(), "a".to_string());
        let mut touched = BTreeSet::new();
        assert_eq!(
            by_service.replace(key, None, &nodes, &mut touched),
            Err(Collision)
        );
    }
}

//! Topology-aware routing (`trafficDistribution`: PreferClose,
//! PreferSameZone, PreferSameNode), as kube-proxy applies it: the
//! EndpointSlice controller writes hints on each endpoint (`forZones`,
//! `forNodes`), and a node keeps the ready endpoints hinted for it when
//! every ready endpoint carries a hint of that kind and at least one names
//! this node (or its zone). Same node goes before same zone. Otherwise
//! (a hint missing, nothing for here, no zone label on the node) every
//! ready endpoint is used: hints narrow the choice, never empty it.

use super::slice::Endpoint;

/// Where this agent runs: its node's name and `topology.kubernetes.io/zone`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Here<'a> {
    pub node: &'a str,
    pub zone: Option<&'a str>,
}

/// Which hints narrow the ready endpoints on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    SameNode,
    SameZone,
}

fn node_hints(endpoint: &Endpoint) -> impl Iterator<Item = &str> {
    endpoint
        .hints
        .iter()
        .flat_map(|h| h.for_nodes.iter().flatten())
        .map(|n| n.name.as_str())
}

fn zone_hints(endpoint: &Endpoint) -> impl Iterator<Item = &str> {
    endpoint
        .hints
        .iter()
        .flat_map(|h| h.for_zones.iter().flatten())
        .map(|z| z.name.as_str())
}

/// The mode the `ready` endpoints (of one Service port) call for here;
/// None: use them all.
pub fn mode<'e>(ready: impl IntoIterator<Item = &'e Endpoint>, here: Here<'_>) -> Option<Mode> {
    let (mut any, mut all_node, mut for_node, mut all_zone, mut for_zone) =
        (false, true, false, true, false);
    for endpoint in ready {
        any = true;
        let mut nodes = node_hints(endpoint).peekable();
        if nodes.peek().is_none() {
            all_node = false;
        } else if nodes.any(|n| n == here.node) {
            for_node = true;
        }
        let mut zones = zone_hints(endpoint).peekable();
        if zones.peek().is_none() {
            all_zone = false;
        } else if zones.any(|z| Some(z) == here.zone) {
            for_zone = true;
        }
    }
    if !any {
        None
    } else if all_node && for_node {
        Some(Mode::SameNode)
    } else if all_zone && for_zone {
        Some(Mode::SameZone)
    } else {
        None
    }
}

/// Whether a ready `endpoint` serves this node under `mode`.
pub fn serves_here(endpoint: &Endpoint, mode: Option<Mode>, here: Here<'_>) -> bool {
    match mode {
        None => true,
        Some(Mode::SameNode) => node_hints(endpoint).any(|n| n == here.node),
        Some(Mode::SameZone) => zone_hints(endpoint).any(|z| Some(z) == here.zone),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn endpoint(nodes: &[&str], zones: &[&str]) -> Endpoint {
        let mut hints = json!({});
        if !nodes.is_empty() {
            hints["forNodes"] = nodes.iter().map(|n| json!({"name": n})).collect();
        }
        if !zones.is_empty() {
            hints["forZones"] = zones.iter().map(|z| json!({"name": z})).collect();
        }
        serde_json::from_value(json!({"addresses": ["10.0.0.1"], "hints": hints})).unwrap()
    }

    const HERE: Here<'static> = Here {
        node: "n1",
        zone: Some("a"),
    };

    #[test]
    fn same_zone_when_every_endpoint_has_a_zone_hint_and_one_is_for_this_zone() {
        let endpoints = [endpoint(&[], &["a"]), endpoint(&[], &["b"])];
        assert_eq!(mode(&endpoints, HERE), Some(Mode::SameZone));
        assert!(serves_here(&endpoints[0], Some(Mode::SameZone), HERE));
        assert!(!serves_here(&endpoints[1], Some(Mode::SameZone), HERE));
    }

    #[test]
    fn same_node_goes_before_same_zone_and_falls_back_to_it() {
        let endpoints = [endpoint(&["n1"], &["a"]), endpoint(&["n2"], &["a"])];
        assert_eq!(mode(&endpoints, HERE), Some(Mode::SameNode));
        assert!(!serves_here(&endpoints[1], Some(Mode::SameNode), HERE));
        // Nothing for this node: the same zone's endpoints.
        let elsewhere = Here {
            node: "n3",
            zone: Some("a"),
        };
        assert_eq!(mode(&endpoints, elsewhere), Some(Mode::SameZone));
    }

    #[test]
    fn all_endpoints_when_a_hint_is_missing_or_none_is_for_here() {
        let one_without = [endpoint(&[], &["a"]), endpoint(&[], &[])];
        assert_eq!(mode(&one_without, HERE), None);
        let none_for_here = [endpoint(&[], &["b"]), endpoint(&[], &["c"])];
        assert_eq!(mode(&none_for_here, HERE), None);
        let no_zone_label = Here {
            node: "n1",
            zone: None,
        };
        assert_eq!(mode(&[endpoint(&[], &["a"])], no_zone_label), None);
        assert_eq!(mode(&[], HERE), None);
        assert!(serves_here(&one_without[1], None, HERE));
    }
}

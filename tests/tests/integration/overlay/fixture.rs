//! What the overlay tests share: n3 on a segment of its own, flatnet's
//! routes on a node, and the packets its VXLAN device sent.

use flatnet_tests::cluster::*;

/// n1 and n2 on segment 0, n3 on segment 1.
pub(super) fn split_specs() -> Vec<NodeSpec> {
    let mut specs = Cluster::numbered(3, false);
    let n3 = specs.pop().expect("n3").on_segment(1);
    specs.push(n3);
    specs
}

/// flatnet's IPv4 routes on `node`, whole lines as `ip route` shows them.
pub(super) fn route_lines(node: &SimNode) -> Vec<String> {
    let mut lines: Vec<String> = node
        .netns
        .exec(&["ip", "-4", "route", "show", "proto", ROUTE_PROTO])
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The route line of `cidr` on `node`.
pub(super) fn route_of(node: &SimNode, cidr: &str) -> String {
    route_lines(node)
        .into_iter()
        .find(|line| line.starts_with(cidr))
        .unwrap_or_else(|| {
            panic!(
                "{}: no route of {cidr} in {:?}",
                node.spec.name,
                route_lines(node)
            )
        })
}

/// Packets the node's VXLAN device sent.
pub(super) fn tunnelled(node: &SimNode) -> u64 {
    let shown = node
        .netns
        .exec(&["ip", "-s", "-j", "link", "show", "flatnet.vxlan"]);
    let json: serde_json::Value = serde_json::from_str(&shown).expect("ip's JSON");
    json[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .expect("tx packets")
}

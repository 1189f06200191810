//! What the cluster tests read off a simulated node: its no-masquerade
//! set and whether `from_uplink` is attached to its uplink.

use std::process::Command;

use flatnet_tests::cluster::*;
use flatnet_tests::*;
use serde_json::Value;

/// The elements of `node`'s IPv4 no-masquerade set, as CIDRs; None when
/// the set does not exist.
pub(super) fn no_masq_elements(node: &SimNode) -> Option<Vec<String>> {
    let set = flatnet_datapath::masquerade::no_masq_set(&node.network, true);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node.netns.name,
            "nft",
            "-j",
            "list",
            "set",
        ])
        .args(["inet", "flatnet", &set])
        .output()
        .expect("run nft");
    if !out.status.success() {
        return None;
    }
    let listing: Value = serde_json::from_slice(&out.stdout).expect("nft JSON");
    let elements = listing["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["set"]["elem"].as_array())
        .flatten()
        .map(|element| match element.as_str() {
            Some(address) => format!("{address}/32"),
            None => format!(
                "{}/{}",
                element["prefix"]["addr"].as_str().unwrap_or("?"),
                element["prefix"]["len"]
            ),
        })
        .collect();
    Some(elements)
}

/// True while `from_uplink` is attached to the node's uplink (a tcx link,
/// as `bpftool net` in the node's namespace lists it).
pub(super) fn uplink_program_attached(node: &SimNode) -> bool {
    bpftool_ok(
        &mut node
            .netns
            .command(&["bpftool", "net", "show", "dev", "up0"]),
    )
    .contains("tcx/ingress from_uplink")
}

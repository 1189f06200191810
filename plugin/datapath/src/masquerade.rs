//! `"ipMasq": true`: traffic from a network's pods to anywhere outside its
//! subnets and outside the cluster's other pod CIDRs leaves the node with
//! the node's address. One nftables table (`inet flatnet`) owned by flatnet,
//! with one masquerade rule per subnet of each network, tagged
//! `flatnet:<network>`, and per network two interval sets of destinations
//! that are never masqueraded: `nomasq4-<network>` and `nomasq6-<network>`.
//! The node agent keeps them equal to the other nodes' pod CIDRs, so pod to
//! pod traffic across nodes keeps the pod's address whichever way it takes
//! (eBPF fast path or host stack); without an agent they stay empty.
//!
//! ADD installs the rules once (a marker under /run/flatnet remembers it, so
//! later ADDs pay nothing); the network's teardown removes them, its sets,
//! and, with the last rule and set, the table. /run is tmpfs, like the
//! nftables ruleset both vanish with a reboot. Every change is made under
//! the exclusive `nftables` lock.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ipnetwork::IpNetwork;

use crate::error::{Error, Result};
use crate::lock::{LOCK_DIR, Lock};
use crate::util::normalized;

const TABLE: &str = "flatnet";
const CHAIN: &str = "postrouting";
/// The lock every change to flatnet's table is made under.
const LOCK: &str = "nftables";

fn tag(network: &str) -> String {
    format!("flatnet:{network}")
}

fn marker(network: &str) -> PathBuf {
    PathBuf::from(LOCK_DIR).join(format!("masq-{network}"))
}

/// The name of `network`'s set of destinations never masqueraded, per
/// family. Network names (letters, digits, `_`, `.`, `-`, at most 128) are
/// valid in nftables set names as they are.
pub fn no_masq_set(network: &str, ipv4: bool) -> String {
    format!("nomasq{}-{network}", if ipv4 { 4 } else { 6 })
}

/// Runs `nft` with `script` on stdin (or `args`); its stdout.
fn nft(args: &[&str], script: Option<&str>) -> Result<String> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::kernel("running nft (package nftables) for ipMasq", e))?;
    if let (Some(script), Some(mut stdin)) = (script, child.stdin.take()) {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::kernel("running nft", e))?;
    if !out.status.success() {
        return Err(Error::kernel(
            format!("nft {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The rule text for one subnet: masquerade what leaves it, unless it goes
/// to another node's pods.
fn rule(subnet: &IpNetwork, network: &str) -> String {
    let family = if subnet.is_ipv4() { "ip" } else { "ip6" };
    let subnet = normalized(*subnet);
    let set = no_masq_set(network, subnet.is_ipv4());
    format!(
        "add rule inet {TABLE} {CHAIN} {family} saddr {subnet} {family} daddr != {subnet} {family} daddr != @{set} masquerade comment \"{}\"\n",
        tag(network)
    )
}

/// Declares the table and `network`'s two sets; `add` keeps what exists
/// (elements included).
fn declare_sets(network: &str) -> String {
    format!(
        "add table inet {TABLE}\nadd set inet {TABLE} {} {{ type ipv4_addr; flags interval; }}\nadd set inet {TABLE} {} {{ type ipv6_addr; flags interval; }}\n",
        no_masq_set(network, true),
        no_masq_set(network, false)
    )
}

/// flatnet's table as nft lists it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Listing {
    exists: bool,
    /// (handle, comment) of each rule.
    rules: Vec<(u64, String)>,
    /// Each set's elements as text ("10.0.0.0/24"), sorted.
    sets: BTreeMap<String, Vec<String>>,
}

impl Listing {
    fn handles(&self, network: &str) -> Vec<u64> {
        let wanted = tag(network);
        self.rules
            .iter()
            .filter(|(_, comment)| *comment == wanted)
            .map(|(handle, _)| *handle)
            .collect()
    }
}

/// Parses `nft -j list table inet flatnet`.
fn parse_listing(text: &str) -> Result<Listing> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::kernel("reading nft's JSON listing", e))?;
    let mut listing = Listing {
        exists: true,
        ..Listing::default()
    };
    for item in json["nftables"].as_array().into_iter().flatten() {
        if let Some(rule) = item.get("rule") {
            if let Some(handle) = rule["handle"].as_u64() {
                let comment = rule["comment"].as_str().unwrap_or_default().to_string();
                listing.rules.push((handle, comment));
            }
        } else if let Some(set) = item.get("set") {
            let Some(name) = set["name"].as_str() else {
                continue;
            };
            let mut elements: Vec<String> = set["elem"]
                .as_array()
                .into_iter()
                .flatten()
                .map(element_text)
                .collect();
            elements.sort();
            listing.sets.insert(name.to_string(), elements);
        }
    }
    Ok(listing)
}

/// One set element as a CIDR's text; anything else (a range nft could not
/// print as a prefix) as its JSON, which never equals a wanted CIDR.
fn element_text(element: &serde_json::Value) -> String {
    if let Some(address) = element.as_str().and_then(|a| a.parse::<IpAddr>().ok()) {
        return IpNetwork::from(address).to_string();
    }
    let prefix = &element["prefix"];
    if let (Some(address), Some(len)) = (
        prefix["addr"]
            .as_str()
            .and_then(|a| a.parse::<IpAddr>().ok()),
        prefix["len"].as_u64().and_then(|l| u8::try_from(l).ok()),
    ) && let Ok(net) = IpNetwork::new(address, len)
    {
        return net.to_string();
    }
    element.to_string()
}

/// The table as it is now; an empty listing when it does not exist (or nft
/// cannot be run: then nothing of ours can be there either).
fn list_table() -> Result<Listing> {
    match nft(&["-j", "list", "table", "inet", TABLE], None) {
        Ok(text) => parse_listing(&text),
        Err(_) => Ok(Listing::default()),
    }
}

/// Makes sure `network`'s subnets are masqueraded (idempotent, race-free
/// across concurrent ADDs); ADD turns forwarding on (`Forwarding`).
pub fn ensure(network: &str, subnets: &[IpNetwork]) -> Result<()> {
    let wanted: Vec<String> = subnets.iter().map(|s| rule(s, network)).collect();
    let marker = marker(network);
    if std::fs::read_to_string(&marker).is_ok_and(|done| done == wanted.concat()) {
        return Ok(());
    }
    let _lock = Lock::exclusive(LOCK)?;
    if std::fs::read_to_string(&marker).is_ok_and(|done| done == wanted.concat()) {
        return Ok(());
    }
    let mut script = declare_sets(network);
    script.push_str(&format!(
        "add chain inet {TABLE} {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
    ));
    // Rules of an earlier, different subnet set (or a lost marker) go first.
    for handle in list_table()?.handles(network) {
        script.push_str(&format!(
            "delete rule inet {TABLE} {CHAIN} handle {handle}\n"
        ));
    }
    script.extend(wanted.iter().cloned());
    nft(&["-f", "-"], Some(&script))?;
    std::fs::write(&marker, wanted.concat())
        .map_err(|e| Error::io(format!("writing {}", marker.display()), e))
}

/// True when ADD installed rules for `network` (its marker is there).
pub fn installed(network: &str) -> bool {
    marker(network).exists()
}

/// Makes `network`'s never-masqueraded sets hold exactly `cidrs` (the other
/// nodes' pod CIDRs), creating the table and sets when absent; one nft
/// transaction, so no packet sees a half-updated set. False when they
/// already did (nothing written).
pub fn set_unmasqueraded(network: &str, cidrs: &[IpNetwork]) -> Result<bool> {
    let mut wanted: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    for cidr in cidrs {
        wanted[usize::from(cidr.is_ipv6())].push(normalized(*cidr).to_string());
    }
    for family in &mut wanted {
        family.sort();
        family.dedup();
    }
    let names = [no_masq_set(network, true), no_masq_set(network, false)];
    let in_place = |listing: &Listing| {
        names
            .iter()
            .zip(&wanted)
            .all(|(name, elements)| listing.sets.get(name) == Some(elements))
    };
    // The common case, nothing changed, without the lock a network's
    // teardown may be waiting for; checked again under it before writing.
    if in_place(&list_table()?) {
        return Ok(false);
    }
    let _lock = Lock::exclusive(LOCK)?;
    if in_place(&list_table()?) {
        return Ok(false);
    }
    let mut script = declare_sets(network);
    for (name, elements) in names.iter().zip(&wanted) {
        script.push_str(&format!("flush set inet {TABLE} {name}\n"));
        if !elements.is_empty() {
            script.push_str(&format!(
                "add element inet {TABLE} {name} {{ {} }}\n",
                elements.join(", ")
            ));
        }
    }
    nft(&["-f", "-"], Some(&script))?;
    Ok(true)
}

/// What an agent's uninstall leaves of `network`'s nftables state: no
/// element in its sets. Rules pods still use keep their (now empty) sets;
/// without rules the sets go, and the table with the last of everything.
pub fn forget_unmasqueraded(network: &str) -> Result<()> {
    let _lock = Lock::exclusive(LOCK)?;
    let listing = list_table()?;
    if !listing.handles(network).is_empty() {
        let script: String = [no_masq_set(network, true), no_masq_set(network, false)]
            .iter()
            .filter(|name| listing.sets.get(*name).is_some_and(|e| !e.is_empty()))
            .map(|name| format!("flush set inet {TABLE} {name}\n"))
            .collect();
        if !script.is_empty() {
            nft(&["-f", "-"], Some(&script))?;
        }
        return Ok(());
    }
    remove_locked(network, &listing)
}

/// Removes `network`'s rules and sets, and the table with the last of them.
pub fn remove(network: &str) -> Result<()> {
    let _lock = Lock::exclusive(LOCK)?;
    let listing = list_table()?;
    remove_locked(network, &listing)
}

fn remove_locked(network: &str, listing: &Listing) -> Result<()> {
    let _ = std::fs::remove_file(marker(network));
    if !listing.exists {
        return Ok(());
    }
    // Rules first: a set cannot go while a rule refers to it.
    let mut script: String = listing
        .handles(network)
        .iter()
        .map(|h| format!("delete rule inet {TABLE} {CHAIN} handle {h}\n"))
        .collect();
    let sets = [no_masq_set(network, true), no_masq_set(network, false)];
    for name in sets.iter().filter(|name| listing.sets.contains_key(*name)) {
        script.push_str(&format!("delete set inet {TABLE} {name}\n"));
    }
    // Only an empty table of ours is dropped: other networks keep theirs.
    let others_rules = listing.rules.len() > listing.handles(network).len();
    let others_sets = listing.sets.keys().any(|name| !sets.contains(name));
    if !others_rules && !others_sets {
        script.push_str(&format!("delete table inet {TABLE}\n"));
    }
    if !script.is_empty() {
        nft(&["-f", "-"], Some(&script))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_masquerade_what_leaves_each_subnet_except_to_other_nodes_pods() {
        let v4 = rule(&"10.42.0.5/24".parse().unwrap(), "pods");
        assert_eq!(
            v4,
            "add rule inet flatnet postrouting ip saddr 10.42.0.0/24 ip daddr != 10.42.0.0/24 ip daddr != @nomasq4-pods masquerade comment \"flatnet:pods\"\n"
        );
        let v6 = rule(&"fd42::1/64".parse().unwrap(), "pods");
        assert!(
            v6.contains("ip6 saddr fd42::/64 ip6 daddr != fd42::/64 ip6 daddr != @nomasq6-pods "),
            "{v6}"
        );
    }

    #[test]
    fn listings_give_rules_by_network_and_set_elements_as_cidrs() {
        let text = r#"{"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "inet", "name": "flatnet", "handle": 1}},
            {"set": {"family": "inet", "name": "nomasq4-a.b", "table": "flatnet", "type": "ipv4_addr",
                     "elem": [{"prefix": {"addr": "10.3.0.0", "len": 24}}, "10.2.0.5",
                              {"prefix": {"addr": "10.1.0.0", "len": 16}}]}},
            {"set": {"family": "inet", "name": "nomasq6-a.b", "table": "flatnet", "type": "ipv6_addr"}},
            {"rule": {"family": "inet", "table": "flatnet", "chain": "postrouting", "handle": 3, "comment": "flatnet:a.b"}},
            {"rule": {"family": "inet", "table": "flatnet", "chain": "postrouting", "handle": 4, "comment": "flatnet:other"}}
        ]}"#;
        let listing = parse_listing(text).unwrap();
        assert!(listing.exists);
        assert_eq!(listing.handles("a.b"), [3]);
        assert_eq!(listing.handles("other"), [4]);
        assert_eq!(
            listing.sets[&no_masq_set("a.b", true)],
            ["10.1.0.0/16", "10.2.0.5/32", "10.3.0.0/24"]
        );
        assert!(listing.sets[&no_masq_set("a.b", false)].is_empty());
    }
}

//! `"ipMasq": true`: traffic from a network's pods to anywhere outside its
//! subnets leaves the node with the node's address. One nftables table
//! (`inet flatnet`) owned by flatnet, with one masquerade rule per subnet of
//! each network, tagged `flatnet:<network>`.
//!
//! ADD installs the rules once (a marker under /run/flatnet remembers it, so
//! later ADDs pay nothing); the network's teardown removes them and, with
//! the last rule, the table. /run is tmpfs, like the nftables ruleset both
//! vanish with a reboot.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ipnetwork::IpNetwork;

use crate::cni::error::{Error, Result};
use crate::link::set_sysctl;
use crate::lock::{LOCK_DIR, Lock};

const TABLE: &str = "flatnet";
const CHAIN: &str = "postrouting";

fn tag(network: &str) -> String {
    format!("flatnet:{network}")
}

fn marker(network: &str) -> PathBuf {
    PathBuf::from(LOCK_DIR).join(format!("masq-{network}"))
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

/// The rule text for one subnet: masquerade what leaves it.
fn rule(subnet: &IpNetwork, network: &str) -> String {
    let family = if subnet.is_ipv4() { "ip" } else { "ip6" };
    let subnet = IpNetwork::new(subnet.network(), subnet.prefix()).unwrap_or(*subnet);
    format!(
        "add rule inet {TABLE} {CHAIN} {family} saddr {subnet} {family} daddr != {subnet} masquerade comment \"{}\"\n",
        tag(network)
    )
}

/// Handles of the rules tagged for `network` in flatnet's chain.
fn handles(network: &str) -> Result<Vec<u64>> {
    let listing = match nft(&["-j", "-a", "list", "chain", "inet", TABLE, CHAIN], None) {
        Ok(listing) => listing,
        // No table or chain: no rule.
        Err(_) => return Ok(Vec::new()),
    };
    let json: serde_json::Value = serde_json::from_str(&listing)
        .map_err(|e| Error::kernel("reading nft's JSON listing", e))?;
    let wanted = tag(network);
    Ok(json["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item.get("rule"))
        .filter(|rule| rule["comment"].as_str() == Some(wanted.as_str()))
        .filter_map(|rule| rule["handle"].as_u64())
        .collect())
}

/// Makes sure `network`'s subnets are masqueraded (idempotent, race-free
/// across concurrent ADDs), and that the node forwards IPv4 at all.
pub fn ensure(network: &str, subnets: &[IpNetwork]) -> Result<()> {
    let wanted: Vec<String> = subnets.iter().map(|s| rule(s, network)).collect();
    let marker = marker(network);
    if std::fs::read_to_string(&marker).is_ok_and(|done| done == wanted.concat()) {
        return Ok(());
    }
    let _lock = Lock::exclusive("nftables")?;
    if std::fs::read_to_string(&marker).is_ok_and(|done| done == wanted.concat()) {
        return Ok(());
    }
    // Pods leave through the host stack: it must forward (as the reference
    // bridge plugin does for isGateway).
    set_sysctl("net/ipv4/ip_forward", "1")?;
    let mut script = format!(
        "add table inet {TABLE}\nadd chain inet {TABLE} {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
    );
    // Rules of an earlier, different subnet set (or a lost marker) go first.
    for handle in handles(network)? {
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

/// Removes `network`'s rules, and the table with the last of them.
pub fn remove(network: &str) -> Result<()> {
    let _lock = Lock::exclusive("nftables")?;
    let _ = std::fs::remove_file(marker(network));
    let doomed = handles(network)?;
    if !doomed.is_empty() {
        let script: String = doomed
            .iter()
            .map(|h| format!("delete rule inet {TABLE} {CHAIN} handle {h}\n"))
            .collect();
        nft(&["-f", "-"], Some(&script))?;
    }
    // Only an empty table of ours is dropped: other networks keep theirs.
    if let Ok(listing) = nft(&["-j", "list", "table", "inet", TABLE], None)
        && !listing.contains("\"rule\"")
    {
        nft(&["delete", "table", "inet", TABLE], None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_masquerade_what_leaves_each_subnet() {
        let v4 = rule(&"10.42.0.5/24".parse().unwrap(), "pods");
        assert_eq!(
            v4,
            "add rule inet flatnet postrouting ip saddr 10.42.0.0/24 ip daddr != 10.42.0.0/24 masquerade comment \"flatnet:pods\"\n"
        );
        let v6 = rule(&"fd42::1/64".parse().unwrap(), "pods");
        assert!(
            v6.contains("ip6 saddr fd42::/64 ip6 daddr != fd42::/64"),
            "{v6}"
        );
    }
}

//! The guard on the host: an nftables table that drops, and counts, every
//! packet of the cluster's ranges leaving the host's network namespace
//! through any interface but loopback. The cluster's machines are not
//! connected to the host at all and have no default route, so the counter
//! must stay 0; the guard is what would catch a mistake in that (a route, a
//! veth into the host, a component that found a way out), and the run
//! fails if it ever counted anything.
//!
//! Before the real guard goes on, [`self_test`] proves the same rules drop
//! and count: in two namespaces of its own, a datagram from a cluster
//! address of each family is sent across a veth with the guard in the
//! sender's namespace, and must be counted and never arrive.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use flatnet_harness::Netns;

use crate::util::output;

use super::plan::Plan;

pub const TABLE: &str = "flatnet-e2e-guard";
const COUNTER: &str = "leaked";

/// The ruleset: one named counter, and in output, forward and postrouting
/// a drop of anything from or to the cluster's ranges leaving through a
/// device other than loopback.
pub fn ruleset(ranges: &[&str]) -> String {
    // One set per family: nft matches IPv4 ranges with `ip`, IPv6 with `ip6`.
    let (ipv6, ipv4): (Vec<&str>, Vec<&str>) = ranges.iter().partition(|r| r.contains(':'));
    let mut rules = String::new();
    for (family, set) in [("ip", ipv4), ("ip6", ipv6)] {
        if set.is_empty() {
            continue;
        }
        let set = set.join(", ");
        for direction in ["saddr", "daddr"] {
            rules.push_str(&format!(
                "    oifname != \"lo\" {family} {direction} {{ {set} }} counter name {COUNTER} drop\n"
            ));
        }
    }
    let chain = |name: &str, hook: &str| {
        format!(
            "  chain {name} {{
    type filter hook {hook} priority -400; policy accept;
{rules}  }}
"
        )
    };
    format!(
        "table inet {TABLE} {{
  counter {COUNTER} {{ }}
{}{}{}}}
",
        chain("output", "output"),
        chain("forward", "forward"),
        chain("postrouting", "postrouting"),
    )
}

/// The guard in the host's network namespace, removed on drop.
pub struct Guard {
    netns: Option<String>,
}

impl Guard {
    /// Installs the guard in the host's network namespace (or `netns`).
    pub fn install(netns: Option<&str>) -> anyhow::Result<Self> {
        let guard = Guard {
            netns: netns.map(str::to_string),
        };
        // A crashed run's table goes first: its counter starts again at 0.
        let _ = output(&mut guard.nft(&["delete", "table", "inet", TABLE]));
        crate::util::output_with_stdin(
            &mut guard.nft(&["-f", "-"]),
            ruleset(&Plan::ranges()).as_bytes(),
        )
        .context("installing the uplink guard (nft)")?;
        Ok(guard)
    }

    fn nft(&self, args: &[&str]) -> Command {
        let mut cmd = match &self.netns {
            Some(netns) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", netns, "nft"]);
                cmd
            }
            None => Command::new("nft"),
        };
        cmd.args(args);
        cmd
    }

    /// Packets the guard dropped so far.
    pub fn dropped(&self) -> anyhow::Result<u64> {
        let listed = output(&mut self.nft(&["-j", "list", "counter", "inet", TABLE, COUNTER]))?;
        parse_counter(&listed)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = output(&mut self.nft(&["delete", "table", "inet", TABLE]));
    }
}

/// `packets` of the named counter in `nft -j list counter` output.
fn parse_counter(json: &str) -> anyhow::Result<u64> {
    let value: serde_json::Value = serde_json::from_str(json).context("nft's JSON")?;
    value["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|item| item["counter"]["packets"].as_u64())
        .context("no counter in nft's answer")
}

/// Proves the ruleset drops and counts a cluster-sourced packet, in two
/// namespaces made for it (removed again).
pub fn self_test() -> anyhow::Result<()> {
    let sender = Netns::unique("fe2e-ga-")?;
    let receiver = Netns::unique("fe2e-gb-")?;
    let sh = |netns: &Netns, script: &str| -> anyhow::Result<String> {
        Ok(output(&mut netns.command(&["sh", "-euc", script]))?)
    };
    sh(
        &sender,
        &format!(
            "ip link add g0 type veth peer name g1 netns {receiver}
             ip addr add 172.29.0.250/24 dev g0
             ip addr add fd29::fa/64 dev g0 nodad
             ip link set g0 up",
            receiver = receiver.name
        ),
    )?;
    sh(
        &receiver,
        "ip addr add 172.29.0.251/24 dev g1; ip addr add fd29::fb/64 dev g1 nodad; ip link set g1 up",
    )?;
    let guard = Guard::install(Some(&sender.name))?;
    // One datagram of each family, each from a cluster address.
    for (from, to) in [("172.29.0.250", "172.29.0.251"), ("fd29::fa", "fd29::fb")] {
        let before = guard.dropped()?;
        let received = send_one_datagram(&sender, &receiver, to)?;
        if guard.dropped()? == before {
            bail!("the guard's self-test: a datagram from {from} was not counted");
        }
        if !received.is_empty() {
            bail!("the guard's self-test: a datagram from {from} got through");
        }
    }
    Ok(())
}

/// What `receiver` got of one datagram `sender` sent to `to`.
fn send_one_datagram(sender: &Netns, receiver: &Netns, to: &str) -> anyhow::Result<Vec<u8>> {
    let listener = receiver
        .command(&["timeout", "3", "nc", "-u", "-l", "-W", "1", to, "4999"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting nc in the guard's self-test")?;
    std::thread::sleep(Duration::from_millis(300));
    output(&mut sender.command(&[
        "sh",
        "-c",
        &format!("printf leak | nc -u -w 1 {to} 4999 || true"),
    ]))?;
    Ok(listener.wait_with_output()?.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_guards_every_range_both_ways_in_every_hook() {
        let rules = ruleset(&["10.0.0.0/8", "192.0.2.0/24", "fd00::/8"]);
        for hook in ["output", "forward", "postrouting"] {
            assert!(
                rules.contains(&format!("type filter hook {hook}")),
                "{rules}"
            );
        }
        assert_eq!(
            rules
                .matches("ip saddr { 10.0.0.0/8, 192.0.2.0/24 }")
                .count(),
            3
        );
        assert_eq!(
            rules
                .matches("ip daddr { 10.0.0.0/8, 192.0.2.0/24 }")
                .count(),
            3
        );
        assert_eq!(rules.matches("ip6 saddr { fd00::/8 }").count(), 3);
        assert_eq!(rules.matches("ip6 daddr { fd00::/8 }").count(), 3);
        assert_eq!(rules.matches("oifname != \"lo\"").count(), 12);
    }

    #[test]
    fn reads_the_named_counter() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"counter": {"family": "inet", "name": "leaked", "table": "flatnet-e2e-guard", "handle": 1, "packets": 3, "bytes": 180}}]}"#;
        assert_eq!(parse_counter(json).unwrap(), 3);
        assert!(parse_counter(r#"{"nftables": []}"#).is_err());
    }
}

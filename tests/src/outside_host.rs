//! An "outside host": a namespace of its own on a veth from the node.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use crate::{Netns, enter, run_ok, unique};

/// An "outside host": a namespace of its own on a veth from the node (the
/// caller's namespace, or `node`'s), `<prefix>.1/24` on the node's end and
/// `<prefix>.2/24` on its `eth0`. The node's end goes on drop.
pub struct OutsideHost {
    pub netns: Netns,
    pub node_side: String,
    pub prefix: String,
    node: Option<PathBuf>,
}

impl OutsideHost {
    pub fn new(node: Option<&Netns>, prefix: &str) -> Self {
        let netns = Netns::new();
        let node_side = unique("fo");
        let in_node = |args: &[&str]| {
            let mut cmd = Command::new(args[0]);
            cmd.args(&args[1..]);
            if let Some(node) = node {
                enter(&mut cmd, &node.path()).expect("enter the node's netns");
            }
            run_ok(&mut cmd);
        };
        in_node(&[
            "ip",
            "link",
            "add",
            &node_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &netns.name,
        ]);
        in_node(&[
            "ip",
            "addr",
            "add",
            &format!("{prefix}.1/24"),
            "dev",
            &node_side,
        ]);
        in_node(&["ip", "link", "set", &node_side, "up"]);
        netns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{prefix}.2/24"),
            "dev",
            "eth0",
        ]);
        netns.exec(&["ip", "link", "set", "eth0", "up"]);
        OutsideHost {
            netns,
            node_side,
            prefix: prefix.to_string(),
            node: node.map(Netns::path),
        }
    }

    /// The outside host's own address.
    pub fn address(&self) -> Ipv4Addr {
        format!("{}.2", self.prefix)
            .parse()
            .expect("an IPv4 prefix")
    }
}

impl Drop for OutsideHost {
    fn drop(&mut self) {
        let mut cmd = Command::new("ip");
        cmd.args(["link", "del", &self.node_side]);
        if let Some(node) = &self.node
            && enter(&mut cmd, node).is_err()
        {
            return;
        }
        let _ = cmd.output();
    }
}

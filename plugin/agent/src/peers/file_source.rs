//! The static peer source: a YAML (or JSON, which YAML reads too) file
//! listing the nodes, re-read whenever its content changes.
//!
//! ```yaml
//! nodes:
//!   - name: node-1
//!     address: 192.168.1.11        # or addresses: [192.168.1.11, fd00::11]
//!     podCIDR: 10.244.1.0/24       # or podCIDRs: [10.244.1.0/24, fd10:1::/64]
//! ```
//!
//! The file is polled rather than watched with inotify: a ConfigMap volume
//! replaces it through a symlink swap of its directory, which inotify on the
//! file itself does not see, and a poll costs one small read per interval.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnetwork::IpNetwork;
use serde::Deserialize;

use crate::error::{AgentError, Result};
use crate::peers::{Node, PeerSource};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerFile {
    nodes: Vec<FileNode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNode {
    name: String,
    address: Option<IpAddr>,
    #[serde(default)]
    addresses: Vec<IpAddr>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<IpNetwork>,
    #[serde(rename = "podCIDRs", default)]
    pod_cidrs: Vec<IpNetwork>,
}

/// Parses a peer file's content into nodes; the message names what to fix.
pub fn parse(text: &str) -> std::result::Result<Vec<Node>, String> {
    if text.trim().is_empty() {
        return Err("the file is empty; write at least `nodes: []`".into());
    }
    let file: PeerFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let mut seen = BTreeSet::new();
    let mut nodes = Vec::with_capacity(file.nodes.len());
    for entry in file.nodes {
        if entry.name.is_empty() {
            return Err("a node has an empty name".into());
        }
        if !seen.insert(entry.name.clone()) {
            return Err(format!("node {} is listed twice", entry.name));
        }
        let mut addresses: Vec<IpAddr> = entry.address.into_iter().collect();
        addresses.extend(
            entry
                .addresses
                .into_iter()
                .filter(|a| Some(*a) != entry.address),
        );
        let mut pod_cidrs: Vec<IpNetwork> = entry.pod_cidr.into_iter().collect();
        pod_cidrs.extend(
            entry
                .pod_cidrs
                .into_iter()
                .filter(|c| Some(*c) != entry.pod_cidr),
        );
        nodes.push(Node {
            name: entry.name,
            addresses,
            pod_cidrs,
            zone: None,
        });
    }
    Ok(nodes)
}

/// What the file held when last looked at.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Content(Vec<u8>),
    Unreadable(std::io::ErrorKind),
}

/// Nodes from a file, polled every `interval`.
pub struct FileSource {
    path: PathBuf,
    interval: Duration,
    last: Option<Seen>,
}

impl FileSource {
    pub fn new(path: PathBuf, interval: Duration) -> Self {
        FileSource {
            path,
            interval,
            last: None,
        }
    }

    fn error(&self, reason: impl Into<String>) -> AgentError {
        AgentError::PeerFile {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }
}

impl PeerSource for FileSource {
    /// Returns when the content differs from what was last seen: the nodes,
    /// or an error (once per bad content; the last good view stays in force).
    async fn changed(&mut self) -> Result<Vec<Node>> {
        loop {
            let now = match tokio::fs::read(&self.path).await {
                Ok(bytes) => Seen::Content(bytes),
                Err(e) => Seen::Unreadable(e.kind()),
            };
            if self.last.as_ref() != Some(&now) {
                let outcome = match &now {
                    Seen::Content(bytes) => std::str::from_utf8(bytes)
                        .map_err(|e| self.error(format!("not UTF-8: {e}")))
                        .and_then(|text| parse(text).map_err(|reason| self.error(reason))),
                    Seen::Unreadable(kind) => Err(self.error(format!("cannot be read: {kind}"))),
                };
                self.last = Some(now);
                return outcome;
            }
            tokio::time::sleep(self.interval).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_forms_are_read() {
        let yaml = "nodes:\n  - name: a\n    address: 172.31.0.1\n    podCIDR: 10.244.1.0/24\n  - name: b\n    addresses: [172.31.0.2, 'fd00::2']\n    podCIDRs: [10.244.2.0/24, 'fd10:2::/64']\n  - name: c\n    address: 172.31.0.3\n";
        let nodes = parse(yaml).unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].pod_cidrs, ["10.244.1.0/24".parse().unwrap()]);
        assert_eq!(nodes[1].addresses.len(), 2);
        assert_eq!(nodes[1].pod_cidrs.len(), 2);
        assert!(nodes[2].pod_cidrs.is_empty());
        let json =
            r#"{"nodes": [{"name": "a", "address": "172.31.0.1", "podCIDRs": ["10.244.1.0/24"]}]}"#;
        assert_eq!(parse(json).unwrap()[0].name, "a");
        assert!(parse("nodes: []").unwrap().is_empty());
    }

    #[test]
    fn mistakes_are_named() {
        for (text, needle) in [
            ("", "empty"),
            ("nodes:\n  - name: a\n  - name: a\n", "twice"),
            (
                "nodes:\n  - name: a\n    podCIDR: 10.244.1.0/33\n",
                "podCIDR",
            ),
            ("nodes:\n  - name: a\n    adress: 172.31.0.1\n", "adress"),
            ("peers: []\n", "peers"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[tokio::test]
    async fn changes_are_reported_once_each() {
        let dir = std::env::temp_dir().join(format!("flatnet-peerfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("peers.yaml");
        let mut source = FileSource::new(path.clone(), Duration::from_millis(10));
        assert!(
            source.changed().await.is_err(),
            "a missing file is an error"
        );
        std::fs::write(&path, "nodes: [{name: a, podCIDR: 10.244.1.0/24}]").unwrap();
        assert_eq!(source.changed().await.unwrap().len(), 1);
        let next = tokio::time::timeout(Duration::from_millis(100), source.changed()).await;
        assert!(
            next.is_err(),
            "unchanged content must not be reported again"
        );
        std::fs::write(&path, "nodes: [").unwrap();
        assert!(source.changed().await.is_err());
        std::fs::write(&path, "nodes: []").unwrap();
        assert!(source.changed().await.unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

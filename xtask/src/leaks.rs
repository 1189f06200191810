//! What the integration suite leaves on the node. Every object a test makes
//! (namespace, link, pin, run-state file, cgroup, scratch folder) has a
//! unique name of its own, so whatever exists after the suite and not
//! before it is a leak: the suite fails and names it.

use std::collections::BTreeSet;
use std::path::Path;

/// Node-wide files the plugin keeps on purpose (locks others may wait on).
const KEPT: &[&str] = &["/run/flatnet/bpffs.lock", "/run/flatnet/nftables.lock"];

/// The objects on the node at one moment, as paths.
pub struct NodeObjects(BTreeSet<String>);

impl NodeObjects {
    pub fn now() -> Self {
        NodeObjects(
            flatnet_harness::TEST_OBJECT_PLACES
                .iter()
                .flat_map(|place| entries(place))
                .collect(),
        )
    }

    /// What exists now and did not in `before`, minus what is kept on
    /// purpose and what others keep in /tmp.
    pub fn new_since(before: &NodeObjects) -> Vec<String> {
        leaked(before, &Self::now())
    }
}

fn leaked(before: &NodeObjects, now: &NodeObjects) -> Vec<String> {
    now.0
        .difference(&before.0)
        .filter(|path| !KEPT.contains(&path.as_str()) && !is_scratch_of_others(path))
        .cloned()
        .collect()
}

fn entries(place: &str) -> Vec<String> {
    std::fs::read_dir(place)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| Path::new(place).join(entry.file_name()))
        // A cgroup's control files (cgroup.procs, ...) are not objects.
        .filter(|path| !(path.starts_with("/sys/fs/cgroup/unified") && path.is_file()))
        .map(|path| path.to_string_lossy().into_owned())
        .collect()
}

/// In /tmp only the tests' scratch folders (`flatnet-*`) are theirs: the
/// compiler, cargo and whoever else uses /tmp meanwhile are not the suite.
fn is_scratch_of_others(path: &str) -> bool {
    path.strip_prefix("/tmp/")
        .is_some_and(|name| !name.starts_with("flatnet-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_new_and_not_kept_is_a_leak() {
        let before = NodeObjects(
            ["/run/netns/a".to_string()]
                .into_iter()
                .collect::<BTreeSet<_>>(),
        );
        let now = NodeObjects(
            [
                "/run/netns/a",
                "/run/netns/ftest-1",
                "/run/flatnet/bpffs.lock",
                "/tmp/rustcXYZ",
                "/tmp/flatnet-cluster-fc1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        assert_eq!(
            leaked(&before, &now),
            vec!["/run/netns/ftest-1", "/tmp/flatnet-cluster-fc1"]
        );
    }
}

//! What a test, a bench or the demo may leave on the node, listed by
//! name. Every object they make (namespace, link, pin, run-state file,
//! cgroup, scratch folder, bpffs mount, agent process) has a unique name of
//! its own, so whatever exists after a run and not before it is a leak.
//! One listing for the suite's leak check (`cargo xtask test`) and the
//! signal test.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Where what a test or bench makes on the node lives, each place to be
/// listed one level deep.
const TEST_OBJECT_PLACES: &[&str] = &[
    "/run/netns",
    "/sys/class/net",
    "/run/flatnet",
    "/sys/fs/bpf",
    "/sys/fs/bpf/flatnet",
    "/sys/fs/cgroup/unified",
    "/tmp",
];

/// What the first run on a fresh node makes for good, on purpose or by
/// the kernel's and the runtime's design: the plugin's node-wide locks
/// (others may wait on them); the files the kernel's bpf_preload puts in
/// every new bpffs, here when the plugin mounts /sys/fs/bpf (as a node's
/// CNI does where nothing has); podman's cgroupfs parent, made by its
/// first container and kept as every later one's parent.
const KEPT: &[&str] = &[
    "/run/flatnet/bpffs.lock",
    "/run/flatnet/nftables.lock",
    "/sys/fs/bpf/maps.debug",
    "/sys/fs/bpf/progs.debug",
    "/sys/fs/cgroup/unified/libpod_parent",
];

/// The objects on the node at one moment: the entries of `TEST_OBJECT_PLACES`,
/// `mount <line>` for each mount with flatnet in it, and `process
/// <command line>` for each process running a binary of the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeObjects(BTreeSet<String>);

impl NodeObjects {
    /// The node now; `bin_dir` is where the build's binaries are (its
    /// processes: agents, benches, servers).
    pub fn now(bin_dir: &Path) -> Self {
        let mut objects: BTreeSet<String> = TEST_OBJECT_PLACES
            .iter()
            .flat_map(|place| entries(place))
            .collect();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        objects.extend(
            mounts
                .lines()
                .filter(|line| line.contains("flatnet"))
                .map(|line| format!("mount {line}")),
        );
        let bin_dir = bin_dir.to_string_lossy();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(bin_dir.as_ref()) {
                objects.insert(format!("process {}", cmdline.trim_end()));
            }
        }
        NodeObjects(objects)
    }

    /// One object per line, as [`NodeObjects::from_lines`] reads them.
    pub fn to_lines(&self) -> String {
        self.0.iter().map(|object| format!("{object}\n")).collect()
    }

    pub fn from_lines(text: &str) -> Self {
        NodeObjects(text.lines().map(str::to_string).collect())
    }

    /// What exists in `self` and did not in `before`, minus what is kept
    /// on purpose.
    pub fn new_since(&self, before: &NodeObjects) -> Vec<String> {
        self.0
            .difference(&before.0)
            .filter(|object| !KEPT.contains(&object.as_str()))
            .cloned()
            .collect()
    }
}

/// How long what a run leaves may take to go on its own: DEL and ADD hand
/// link deletes and tcx moves to a detached child that outlives the verb
/// (up to 5 s waiting for the network to be quiet, then the work), and a
/// killed agent's zombie or a namespace's last process takes a moment.
pub const SETTLE_AFTER_RUN: Duration = Duration::from_secs(20);

/// What is new on the node since `before` and stays so: listed again until
/// nothing is new or `grace` has passed (what is still there then leaked).
pub fn left_since(before: &NodeObjects, bin_dir: &Path, grace: Duration) -> Vec<String> {
    let mut left = Vec::new();
    crate::poll_until(grace, Duration::from_millis(250), || {
        left = NodeObjects::now(bin_dir).new_since(before);
        left.is_empty()
    });
    left
}

fn entries(place: &str) -> Vec<String> {
    std::fs::read_dir(place)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| is_object(place, entry))
        .map(|entry| format!("{place}/{}", entry.file_name().to_string_lossy()))
        .collect()
}

fn is_object(place: &str, entry: &std::fs::DirEntry) -> bool {
    match place {
        // A cgroup's control files (cgroup.procs, ...) are not objects.
        "/sys/fs/cgroup/unified" => entry.file_type().is_ok_and(|kind| kind.is_dir()),
        // In /tmp only the scratch folders of flatnet's own: the compiler,
        // cargo and whoever else uses /tmp meanwhile are not the suite.
        "/tmp" => entry.file_name().to_string_lossy().starts_with("flatnet-"),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects(paths: &[&str]) -> NodeObjects {
        NodeObjects(paths.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn only_what_is_new_and_not_kept_is_a_leak() {
        let before = objects(&["/run/netns/a", "process /bin/flatnet-agent --old"]);
        let now = objects(&[
            "/run/netns/a",
            "/run/netns/ftest-1",
            "/run/flatnet/bpffs.lock",
            "/sys/fs/bpf/maps.debug",
            "process /bin/flatnet-agent --old",
            "process /bin/flatnet-agent --new",
        ]);
        assert_eq!(
            now.new_since(&before),
            vec!["/run/netns/ftest-1", "process /bin/flatnet-agent --new"]
        );
    }

    #[test]
    fn a_listing_reads_back_from_its_lines() {
        let listed = objects(&["/run/netns/a", "mount bpf /tmp/flatnet-x/bpf bpf rw 0 0"]);
        assert_eq!(NodeObjects::from_lines(&listed.to_lines()), listed);
    }

    #[test]
    fn in_tmp_only_flatnets_scratch_folders_are_listed() {
        let scratch = Path::new("/tmp").join(crate::unique("flatnet-objects-"));
        let other = Path::new("/tmp").join(crate::unique("someone-else-"));
        std::fs::create_dir(&scratch).expect("scratch folder");
        std::fs::create_dir(&other).expect("other folder");
        let listed = entries("/tmp");
        let _ = (std::fs::remove_dir(&scratch), std::fs::remove_dir(&other));
        assert!(listed.contains(&scratch.to_string_lossy().into_owned()));
        assert!(!listed.contains(&other.to_string_lossy().into_owned()));
    }
}

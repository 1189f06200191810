//! The tests run the plugin binaries, which `cargo test` does not build:
//! a binary older than its sources would test yesterday's code and pass or
//! fail for the wrong reasons. [`check`] refuses one, once per process and
//! binary.
//!
//! A binary's sources are every file of the crates it is built from (the
//! plugin/ crates it links, common/ and ebpf/ for those with the datapath),
//! and Cargo.lock; `target` directories and hidden files are not sources. It
//! counts as built when its file was written or, if later, when cargo last
//! rewrote the dep-info file beside it (`<binary>.d`): cargo does that on
//! every build that finds the binary up to date, so a binary cargo has
//! just vouched for is not refused because of a change that does not
//! touch it (a dependency of the tests added to Cargo.lock).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// What a binary is built from, relative to the workspace root, and the
/// directories among them it is not built from.
pub fn sources_of(binary: &str) -> (&'static [&'static str], &'static [&'static str]) {
    /// flatnet-ipam speaks CNI and keeps files: no kernel layer.
    const IPAM: &[&str] = &["plugin/cni", "plugin/ipam", "Cargo.lock"];
    /// The plugin: CNI, the kernel layer and the eBPF object in it.
    const PLUGIN: &[&str] = &[
        "plugin/cni",
        "plugin/datapath",
        "plugin/flatnet",
        "common",
        "ebpf",
        "Cargo.lock",
    ];
    /// The agent links every crate of plugin/.
    const AGENT: &[&str] = &["plugin", "common", "ebpf", "Cargo.lock"];
    match binary {
        "flatnet-ipam" => (IPAM, &[]),
        "flatnet-agent" => (AGENT, &[]),
        _ => (PLUGIN, &[]),
    }
}

/// The workspace root (tests/ is one of its members).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Err (the message for the test) when the binary `name` at `path` is
/// older than its sources; checked once per process and binary.
pub fn check(name: &str, path: &Path) -> Result<(), String> {
    static CHECKED: Mutex<BTreeMap<PathBuf, Result<(), String>>> = Mutex::new(BTreeMap::new());
    let mut checked = CHECKED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    checked
        .entry(path.to_path_buf())
        .or_insert_with(|| {
            let (sources, excluded) = sources_of(name);
            compare(path, &workspace_root(), sources, excluded)
        })
        .clone()
}

/// When `binary` was built, or found up to date by cargo (see the module
/// documentation).
pub fn built_at(binary: &Path) -> std::io::Result<SystemTime> {
    let written = binary.metadata()?.modified()?;
    let mut dep_info = binary.as_os_str().to_owned();
    dep_info.push(".d");
    let vouched = std::fs::metadata(dep_info).and_then(|m| m.modified()).ok();
    Ok(vouched.map_or(written, |vouched| vouched.max(written)))
}

/// The most recently modified file among `sources` (files, or directories
/// walked) under `root`, leaving out `excluded` directories, `target`
/// directories and hidden files.
pub fn newest_source(
    root: &Path,
    sources: &[&str],
    excluded: &[&str],
) -> std::io::Result<Option<(PathBuf, SystemTime)>> {
    let excluded: Vec<PathBuf> = excluded.iter().map(|dir| root.join(dir)).collect();
    let mut newest: Option<(PathBuf, SystemTime)> = None;
    let mut pending: Vec<PathBuf> = sources.iter().map(|source| root.join(source)).collect();
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path)?;
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                let entry = entry?;
                let name = entry.file_name();
                let skipped = name == "target" || name.to_string_lossy().starts_with('.');
                if !skipped && !excluded.contains(&entry.path()) {
                    pending.push(entry.path());
                }
            }
            continue;
        }
        let modified = metadata.modified()?;
        if newest.as_ref().is_none_or(|(_, time)| modified > *time) {
            newest = Some((path, modified));
        }
    }
    Ok(newest)
}

/// Err with the message for the test when `binary` is older than the
/// newest of its sources (see [`newest_source`]).
pub fn compare(
    binary: &Path,
    root: &Path,
    sources: &[&str],
    excluded: &[&str],
) -> Result<(), String> {
    let built = built_at(binary).map_err(|e| format!("cannot stat {}: {e}", binary.display()))?;
    let newest = newest_source(root, sources, excluded)
        .map_err(|e| format!("cannot read the sources of {}: {e}", binary.display()))?;
    match newest {
        Some((source, modified)) if modified > built => Err(format!(
            "{} is older than its sources ({} changed after it was built): run `cargo xtask \
             test` or `cargo build -p flatnet -p flatnet-ipam -p flatnet-agent --bins`",
            binary.display(),
            source.strip_prefix(root).unwrap_or(&source).display()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A workspace of its own in the temp dir, removed on drop.
    struct Tree {
        root: PathBuf,
        start: SystemTime,
    }

    impl Tree {
        fn new() -> Self {
            let root = std::env::temp_dir().join(flatnet_harness::unique("flatnet-fresh-"));
            std::fs::create_dir_all(&root).unwrap();
            Tree {
                root,
                start: SystemTime::now() - Duration::from_secs(3600),
            }
        }

        /// Writes `path` as modified `minutes` after the start.
        fn file(&self, path: &str, minutes: u64) -> PathBuf {
            let path = self.root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let file = std::fs::File::create(&path).unwrap();
            file.set_modified(self.start + Duration::from_secs(60 * minutes))
                .unwrap();
            path
        }

        fn compare(&self, binary: &str) -> Result<(), String> {
            let (sources, excluded) = sources_of(binary);
            compare(
                &self.root.join("target/debug").join(binary),
                &self.root,
                sources,
                excluded,
            )
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// Sources in every place, written at minute 1, and `binaries` built
    /// at minute 10.
    fn built(binaries: &[&str]) -> Tree {
        let tree = Tree::new();
        for source in [
            "plugin/cni/src/lib.rs",
            "plugin/ipam/src/lib.rs",
            "plugin/datapath/src/lib.rs",
            "plugin/flatnet/src/lib.rs",
            "plugin/agent/src/main.rs",
            "common/src/lib.rs",
            "ebpf/src/main.rs",
            "Cargo.lock",
        ] {
            tree.file(source, 1);
        }
        for binary in binaries {
            tree.file(&format!("target/debug/{binary}"), 10);
        }
        tree
    }

    #[test]
    fn a_binary_newer_than_its_sources_passes() {
        let tree = built(&["flatnet", "flatnet-agent"]);
        assert_eq!(tree.compare("flatnet"), Ok(()));
        assert_eq!(tree.compare("flatnet-agent"), Ok(()));
    }

    #[test]
    fn a_source_changed_after_the_build_is_named() {
        for source in [
            "plugin/flatnet/src/verbs/add.rs",
            "plugin/datapath/build.rs",
            "plugin/cni/src/result.rs",
            "common/src/lib.rs",
            "ebpf/src/pod.rs",
            "Cargo.lock",
        ] {
            let tree = built(&["flatnet"]);
            tree.file(source, 11);
            let error = tree.compare("flatnet").unwrap_err();
            assert!(
                error.contains("flatnet is older than its sources")
                    && error.contains(&format!("({source} changed after it was built)"))
                    && error
                        .contains("cargo build -p flatnet -p flatnet-ipam -p flatnet-agent --bins"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_agents_sources_are_the_agents_alone() {
        let tree = built(&["flatnet", "flatnet-agent"]);
        tree.file("plugin/agent/src/run.rs", 11);
        assert_eq!(tree.compare("flatnet"), Ok(()));
        assert!(tree.compare("flatnet-agent").is_err());
    }

    #[test]
    fn the_ipam_plugin_is_built_from_cni_and_ipam_alone() {
        let tree = built(&["flatnet-ipam"]);
        tree.file("plugin/datapath/src/bpf/mod.rs", 11);
        tree.file("ebpf/src/pod.rs", 11);
        assert_eq!(tree.compare("flatnet-ipam"), Ok(()));
        tree.file("plugin/ipam/src/store.rs", 12);
        assert!(tree.compare("flatnet-ipam").is_err());
    }

    #[test]
    fn build_output_and_hidden_files_are_not_sources() {
        let tree = built(&["flatnet"]);
        tree.file("ebpf/target/bpfel-unknown-none/release/flatnet", 20);
        tree.file("plugin/flatnet/target/x", 20);
        tree.file("plugin/flatnet/src/.lib.rs.swp", 20);
        assert_eq!(tree.compare("flatnet"), Ok(()));
    }

    #[test]
    fn a_binary_cargo_found_up_to_date_counts_as_built_then() {
        let tree = built(&["flatnet"]);
        // Cargo.lock changed for another package; cargo build rewrote the
        // dep-info without relinking.
        tree.file("Cargo.lock", 11);
        assert!(tree.compare("flatnet").is_err());
        tree.file("target/debug/flatnet.d", 12);
        assert_eq!(tree.compare("flatnet"), Ok(()));
    }

    #[test]
    fn a_missing_binary_is_an_error_not_a_pass() {
        let tree = built(&[]);
        assert!(tree.compare("flatnet").unwrap_err().contains("cannot stat"));
    }
}

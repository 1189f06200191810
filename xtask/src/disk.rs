//! Disk space, said before the suite needs it. A CI run once ran out of
//! space 25 minutes in, importing an image into an e2e machine after the
//! build had taken what was left; the suite now says at its start what it
//! will still write on each filesystem and what is free there, and stops
//! at once when that cannot fit.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::bail;

/// Something the suite writes: where, what, and how big it grows.
pub struct Need {
    pub path: PathBuf,
    pub what: &'static str,
    /// The size it reaches in a run from nothing (measured, see callers).
    pub full_size: u64,
}

pub const GIB: u64 = 1 << 30;

impl Need {
    /// What is left to write: the full size less what is there already.
    fn still(&self) -> u64 {
        self.full_size.saturating_sub(size_of_tree(&self.path))
    }
}

/// Checks that each filesystem has room for what the suite will still
/// write on it, printing one line per filesystem.
pub fn check(needs: &[Need]) -> anyhow::Result<()> {
    // Grouped by the device of the path (or of its nearest ancestor).
    let mut by_device: BTreeMap<u64, (PathBuf, u64, Vec<String>)> = BTreeMap::new();
    for need in needs {
        let existing = nearest_existing(&need.path);
        let Ok(meta) = std::fs::metadata(&existing) else {
            continue;
        };
        let still = need.still();
        let entry = by_device
            .entry(meta.dev())
            .or_insert_with(|| (existing.clone(), 0, Vec::new()));
        entry.1 += still;
        entry.2.push(format!("{} {}", need.what, gib(still)));
    }
    let mut short = Vec::new();
    for (existing, still, parts) in by_device.into_values() {
        let free = free_bytes(&existing).unwrap_or(0);
        let line = format!(
            "{} free on the filesystem of {}; still to write there: about {} ({})",
            gib(free),
            existing.display(),
            gib(still),
            parts.join(", ")
        );
        println!("disk: {line}");
        if free < still {
            short.push(line);
        }
    }
    if !short.is_empty() {
        bail!(
            "not enough disk space for the suite: {}. Free some (another checkout's target/, \
             old Kubernetes builds under /var/cache/flatnet) and run it again",
            short.join("; ")
        );
    }
    Ok(())
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

/// Bytes an unprivileged writer may still use on `path`'s filesystem.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    Some(stat.blocks_available() as u64 * stat.fragment_size() as u64)
}

fn nearest_existing(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// The bytes the files under `path` take on disk (symlinks not followed,
/// other filesystems included: the callers' trees have none).
pub fn size_of_tree(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let children = std::fs::read_dir(path).into_iter().flatten().flatten();
    own + children
        .map(|entry| size_of_tree(&entry.path()))
        .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_counts_its_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data"), vec![7u8; 1 << 20]).unwrap();
        let size = size_of_tree(dir.path());
        assert!((1 << 20..2 << 20).contains(&size), "{size}");
        assert_eq!(size_of_tree(&dir.path().join("absent")), 0);
    }

    #[test]
    fn what_is_there_already_is_not_needed_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), vec![7u8; 1 << 20]).unwrap();
        let need = Need {
            path: dir.path().to_path_buf(),
            what: "test",
            full_size: 3 << 20,
        };
        assert!((1 << 20..=2 << 20).contains(&need.still()));
        let more_than_any_disk = Need {
            path: dir.path().join("not-yet"),
            what: "test",
            full_size: u64::MAX / 2,
        };
        let error = check(&[more_than_any_disk]).unwrap_err().to_string();
        assert!(error.contains("not enough disk space"), "{error}");
        check(&[need]).unwrap();
    }
}

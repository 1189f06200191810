//! bpffs: mounted where flatnet pins, as production CNIs do.

use std::path::Path;

use crate::error::{Error, Result};
use crate::lock::Lock;

/// `BPF_FS_MAGIC` from linux/magic.h.
pub(super) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

pub(super) const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// The nearest existing ancestor of `path` (itself included).
pub(super) fn existing_ancestor(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.exists())
}

/// True when `path` (or, while it does not exist yet, its nearest existing
/// ancestor) is on a bpf file system.
pub(super) fn on_bpffs(path: &Path) -> bool {
    existing_ancestor(path).is_some_and(|p| {
        nix::sys::statfs::statfs(p).is_ok_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
    })
}

/// Mounts bpffs at /sys/fs/bpf unless it already is, as production CNIs do:
/// without it nothing can be pinned and every ADD would reload the programs.
/// A pin root moved elsewhere (`pinRoot`, `FLATNET_PIN_ROOT`, the agent's
/// `--pin-root`) must already be on a bpffs: flatnet mounts only at the
/// standard place.
pub fn ensure_bpffs_at(root: &Path) -> Result<()> {
    if !root.starts_with(BPFFS_MOUNT) {
        if on_bpffs(root) {
            return Ok(());
        }
        return Err(Error::Datapath(format!(
            "the pin root {} is not on a bpf file system: mount one there (mount -t bpf bpf DIR) or use the default pin root",
            root.display()
        )));
    }
    let is_bpffs = || {
        nix::sys::statfs::statfs(BPFFS_MOUNT)
            .map(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
            .unwrap_or(false)
    };
    if is_bpffs() {
        return Ok(());
    }
    // Two plugins mounting at once would stack two bpffs; one mounts, under a lock.
    let _lock = Lock::exclusive("bpffs")?;
    if is_bpffs() {
        return Ok(());
    }
    std::fs::create_dir_all(BPFFS_MOUNT)
        .map_err(|e| Error::io(format!("creating {BPFFS_MOUNT}"), e))?;
    use nix::mount::{MsFlags, mount};
    mount(
        Some("bpf"),
        BPFFS_MOUNT,
        Some("bpf"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0700"),
    )
    .map_err(|e| Error::bpf(format!("mounting bpffs at {BPFFS_MOUNT}"), e))
}

/// True when a bpffs is mounted where `root`'s pins go: /sys/fs/bpf, or the
/// moved pin root (STATUS reports it).
pub fn bpffs_is_mounted(root: &Path) -> bool {
    if !root.starts_with(BPFFS_MOUNT) {
        return on_bpffs(root);
    }
    nix::sys::statfs::statfs(BPFFS_MOUNT).is_ok_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
}

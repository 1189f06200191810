//! The paths containerd makes on the machine whatever its configuration
//! says, and the guard count that removes them again.

use std::path::Path;
use std::sync::Mutex;

/// Paths containerd, its shims and libcni create on the machine whatever
/// the configuration says: the shims' sockets (/run/containerd/s), libcni's
/// result cache (/var/lib/cni, which containerd's CRI uses as well) and the
/// sandboxes' network namespaces (/run/netns/cni-*). Removed again, when
/// empty of others' files, by the last guard of the process that found
/// them absent.
pub(super) const MACHINE_PATHS: &[&str] = &[
    "/run/containerd/s",
    "/run/containerd",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/netns",
];

/// Live guards of this process and the machine paths absent before the
/// first of them started.
static MACHINE: Mutex<(usize, Vec<&'static str>)> = Mutex::new((0, Vec::new()));

/// containerd makes /run/netns a shared bind mount of itself (as `ip netns
/// add` does) the first time it creates a sandbox's netns.
pub(super) const NETNS_DIR: &str = "/run/netns";

pub(super) fn is_mount_point(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(path))
}

pub(super) fn machine() -> std::sync::MutexGuard<'static, (usize, Vec<&'static str>)> {
    MACHINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes the sockets in `dir` nobody listens on (those of shims that
/// were killed: a shim removes its own only when it exits cleanly).
pub(super) fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let refused = matches!(
            std::os::unix::net::UnixStream::connect(&path),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        if refused {
            let _ = std::fs::remove_file(&path);
        }
    }
}

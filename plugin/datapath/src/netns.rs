//! Network namespaces: open and verify a netns path, and enter one for a
//! while on the current thread (restored on drop).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::sched::{CloneFlags, setns};

use crate::error::{Error, Result};

/// `NS_GET_NSTYPE` from linux/nsfs.h: `_IO(0xb7, 0x3)`.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
/// `NSFS_MAGIC` from linux/magic.h.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Why a netns path could not be used.
#[derive(Debug, PartialEq, Eq)]
pub enum NetnsProblem {
    Missing,
    NotANamespace,
    NotNetwork,
    Unreadable(String),
}

/// Opens `path` and makes sure it is a network namespace.
pub fn open(path: &Path) -> std::result::Result<File, NetnsProblem> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => NetnsProblem::Missing,
        _ => NetnsProblem::Unreadable(e.to_string()),
    })?;
    let fs =
        nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsProblem::Unreadable(e.to_string()))?;
    if fs.filesystem_type().0 != NSFS_MAGIC {
        return Err(NetnsProblem::NotANamespace);
    }
    // SAFETY: ioctl on an fd we own; NS_GET_NSTYPE takes no argument.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
    if kind != libc::CLONE_NEWNET {
        return Err(NetnsProblem::NotNetwork);
    }
    Ok(file)
}

/// While alive, the current thread is in another network namespace.
/// Dropping it moves the thread back; if that fails the process aborts,
/// because carrying on would configure the wrong namespace.
pub struct NetnsGuard {
    original: File,
}

impl NetnsGuard {
    pub fn enter(target: &File) -> Result<Self> {
        let original = File::open("/proc/thread-self/ns/net")
            .map_err(|e| Error::io("opening the current network namespace", e))?;
        setns(target, CloneFlags::CLONE_NEWNET)
            .map_err(|e| Error::kernel("entering the container network namespace", e))?;
        Ok(NetnsGuard { original })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.original, CloneFlags::CLONE_NEWNET) {
            eprintln!("flatnet: cannot return to the original network namespace: {e}; aborting");
            std::process::abort();
        }
    }
}

/// Runs `f` with the current thread inside `target`.
pub fn within<T>(target: &File, f: impl FnOnce() -> T) -> Result<T> {
    let _guard = NetnsGuard::enter(target)?;
    Ok(f())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_files_are_not_namespaces() {
        assert_eq!(
            open(Path::new("/proc/self/status")).unwrap_err(),
            NetnsProblem::NotANamespace
        );
        assert_eq!(
            open(Path::new("/nonexistent/netns")).unwrap_err(),
            NetnsProblem::Missing
        );
    }

    #[test]
    fn the_own_netns_is_a_network_namespace_and_others_are_not() {
        assert!(open(Path::new("/proc/self/ns/net")).is_ok());
        assert_eq!(
            open(Path::new("/proc/self/ns/uts")).unwrap_err(),
            NetnsProblem::NotNetwork
        );
    }
}

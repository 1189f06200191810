//! Advisory file locks under /run/flatnet that order the few per-network
//! steps concurrent plugin processes must not interleave.
//!
//! ADDs and DELs hold a network's lock shared while they touch its gateway
//! device, pinned datapath and endpoint map, so they run in parallel. Loading
//! the datapath and tearing a network down take it exclusively.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where lock files live (tmpfs: they vanish with the node's boot).
pub const LOCK_DIR: &str = "/run/flatnet";

/// A held lock; released when dropped (the file is closed).
pub struct Lock {
    _file: File,
    path: PathBuf,
}

fn path_of(name: &str) -> PathBuf {
    PathBuf::from(LOCK_DIR).join(format!("{name}.lock"))
}

fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("opening lock {}", path.display()), e))
}

/// True while `file` is still the one at `path`: a lock file can be
/// removed (see [`Lock::remove`]) by a holder while others wait on it.
fn still_linked(file: &File, path: &Path) -> Result<bool> {
    let held = file
        .metadata()
        .map_err(|e| Error::io(format!("reading lock {}", path.display()), e))?;
    Ok(match std::fs::metadata(path) {
        Ok(current) => current.dev() == held.dev() && current.ino() == held.ino(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(Error::io(format!("reading lock {}", path.display()), e)),
    })
}

/// How long since an ADD or DEL last marked network lock `name` as in use
/// ([`Lock::note_activity`]); None when there is no lock file.
pub fn idle_for(name: &str) -> Option<std::time::Duration> {
    let modified = std::fs::metadata(path_of(name)).ok()?.modified().ok()?;
    Some(modified.elapsed().unwrap_or_default())
}

impl Lock {
    /// Marks the network as busy now (the lock file's mtime): deferred
    /// work that stalls the kernel's rtnl lock waits for a quiet moment.
    pub fn note_activity(&self) {
        let _ = self._file.set_modified(std::time::SystemTime::now());
    }

    pub fn shared(name: &str) -> Result<Self> {
        Self::take(name, false)
    }

    pub fn exclusive(name: &str) -> Result<Self> {
        Self::take(name, true)
    }

    /// The lock shared, only if its file is there: deferred work on a
    /// network that a last DEL has torn down (lock file removed) must not
    /// create the lock file again. None when the file is gone, before or
    /// while waiting for it.
    pub fn shared_if_present(name: &str) -> Result<Option<Self>> {
        Self::shared_if_present_at(path_of(name))
    }

    fn shared_if_present_at(path: PathBuf) -> Result<Option<Self>> {
        let file = match OpenOptions::new().write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("opening lock {}", path.display()), e)),
        };
        file.lock_shared()
            .map_err(|e| Error::io(format!("locking {}", path.display()), e))?;
        Ok(still_linked(&file, &path)?.then_some(Lock { _file: file, path }))
    }

    /// Locks the file at the lock's path, again if it was removed and
    /// replaced while this process waited (then it locked a stale file).
    fn take(name: &str, exclusive: bool) -> Result<Self> {
        std::fs::create_dir_all(LOCK_DIR)
            .map_err(|e| Error::io(format!("creating {LOCK_DIR}"), e))?;
        Self::take_at(path_of(name), exclusive)
    }

    fn take_at(path: PathBuf, exclusive: bool) -> Result<Self> {
        let name = path.display().to_string();
        loop {
            let file = open(&path)?;
            let outcome = if exclusive {
                file.lock()
            } else {
                file.lock_shared()
            };
            outcome.map_err(|e| Error::io(format!("locking {name}"), e))?;
            if still_linked(&file, &path)? {
                return Ok(Lock { _file: file, path });
            }
        }
    }

    /// Removes the lock file while holding it exclusively, so that nothing
    /// of a torn-down network stays behind; a process waiting on it finds
    /// it gone once it gets it, and locks a new one.
    pub fn remove(self) -> Result<()> {
        crate::util::remove_file_if_present(&self.path)
            .map(drop)
            .map_err(|e| Error::io(format!("removing lock {}", self.path.display()), e))
        // `self._file` closes here, after the unlink: no one can lock the
        // old file and believe it current.
    }
}

/// The lock name of a network.
pub fn network(name: &str) -> String {
    format!("network-{name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_waiter_on_a_removed_lock_file_locks_the_new_one() {
        let dir = std::env::temp_dir().join(format!("flatnet-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("network-n.lock");
        let holder = Lock::take_at(path.clone(), true).unwrap();
        let (locked, on_lock) = mpsc::channel();
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || {
                let lock = Lock::take_at(path, true).unwrap();
                locked.send(()).unwrap();
                lock
            })
        };
        // The waiter has opened the file and blocks on it.
        std::thread::sleep(Duration::from_millis(100));
        assert!(on_lock.try_recv().is_err(), "an exclusive lock was shared");
        holder.remove().unwrap();
        on_lock.recv_timeout(Duration::from_secs(5)).unwrap();
        let lock = waiter.join().unwrap();
        // It holds the file now at the path, not the removed one.
        assert!(still_linked(&lock._file, &path).unwrap());
        lock.remove().unwrap();
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn deferred_work_never_creates_a_removed_lock_file_again() {
        let dir = std::env::temp_dir().join(format!("flatnet-lock-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("network-n.lock");
        // No file: no lock, and still no file.
        assert!(Lock::shared_if_present_at(path.clone()).unwrap().is_none());
        assert!(!path.exists());
        // Removed while waiting on it (a last DEL tearing the network down).
        let holder = Lock::take_at(path.clone(), true).unwrap();
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || Lock::shared_if_present_at(path).unwrap().is_none())
        };
        std::thread::sleep(Duration::from_millis(100));
        holder.remove().unwrap();
        assert!(
            waiter.join().unwrap(),
            "a lock on a removed file was handed out"
        );
        assert!(!path.exists(), "the removed lock file was created again");
        // Present: shared like any other holder.
        let _held = Lock::take_at(path.clone(), false).unwrap();
        assert!(Lock::shared_if_present_at(path.clone()).unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Advisory file locks under /run/flatnet that order the few per-network
//! steps concurrent plugin processes must not interleave.
//!
//! ADDs and DELs hold a network's lock shared while they touch its gateway
//! device, pinned datapath and endpoint map, so they run in parallel. Loading
//! the datapath and tearing a network down take it exclusively.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use crate::cni::error::{Error, Result};

/// Where lock files live (tmpfs: they vanish with the node's boot).
pub const LOCK_DIR: &str = "/run/flatnet";

/// A held lock; released when dropped (the file is closed).
pub struct Lock {
    _file: File,
}

fn open(name: &str) -> Result<File> {
    std::fs::create_dir_all(LOCK_DIR).map_err(|e| Error::io(format!("creating {LOCK_DIR}"), e))?;
    let path = PathBuf::from(LOCK_DIR).join(format!("{name}.lock"));
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("opening lock {}", path.display()), e))
}

impl Lock {
    pub fn shared(name: &str) -> Result<Self> {
        let file = open(name)?;
        file.lock_shared()
            .map_err(|e| Error::io(format!("locking {name} (shared)"), e))?;
        Ok(Lock { _file: file })
    }

    pub fn exclusive(name: &str) -> Result<Self> {
        let file = open(name)?;
        file.lock()
            .map_err(|e| Error::io(format!("locking {name}"), e))?;
        Ok(Lock { _file: file })
    }
}

/// The lock name of a network.
pub fn network(name: &str) -> String {
    format!("network-{name}")
}

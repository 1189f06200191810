//! A cgroup v2 directory of a test's (or the bench's) own, for the Service
//! socket programs: attached there, they act on the processes put in it
//! only. Removed on drop (its processes have exited by then).

use std::path::PathBuf;

pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        let root = flatnet_datapath::util::cgroup2_root()?.ok_or_else(|| {
            std::io::Error::other("no cgroup v2 mount (the socket programs need one)")
        })?;
        let dir = root.join(crate::unique(prefix));
        std::fs::create_dir(&dir)?;
        Ok(TestCgroup(dir))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.0) {
            eprintln!("removing {}: {e}", self.0.display());
        }
    }
}

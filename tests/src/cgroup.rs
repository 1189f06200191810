//! A cgroup v2 directory of a test's (or the bench's) own, for the Service
//! socket programs: attached there, they act on the processes put in it
//! only. Removed on drop (its processes have exited by then), or, should a
//! signal end the process, with its processes killed first
//! (`crate::remove_on_signal`).

use std::path::PathBuf;

pub struct TestCgroup(pub PathBuf, Option<crate::Listed>);

impl TestCgroup {
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        let root = flatnet_datapath::util::cgroup2_root()?.ok_or_else(|| {
            std::io::Error::other("no cgroup v2 mount (the socket programs need one)")
        })?;
        let dir = root.join(crate::unique(prefix));
        std::fs::create_dir(&dir)?;
        let listed = {
            let dir = dir.clone();
            crate::made_here(move || crate::kill_and_remove_cgroup(&dir))
        };
        Ok(TestCgroup(dir, Some(listed)))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.0) {
            eprintln!("removing {}: {e}", self.0.display());
        }
        if let Some(listed) = self.1.take() {
            listed.removed();
        }
    }
}

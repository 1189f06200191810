//! Global kernel settings the cluster's components change, saved before
//! anything starts and put back after: kubelet 1.20 writes its "kernel
//! tunables" (`kernel.panic` 1 -> 10, `kernel.panic_on_oops` 0 -> 1,
//! `vm.overcommit_memory` 0 -> 1, ...) whatever namespace it runs in, since
//! they are not namespaced. kube-proxy's settings are all per network
//! namespace here (its node's), except conntrack's table size, which its
//! configuration leaves alone; they are checked anyway.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::node::KUBELET_SYSCTLS;

/// Settings under /proc/sys that belong to the whole machine and that a
/// component of the cluster may write.
const WATCHED: &[&str] = &["net/netfilter/nf_conntrack_max", "net/nf_conntrack_max"];
/// A module parameter kube-proxy raises with nf_conntrack_max.
const CONNTRACK_HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// The saved values, also written to a file: a run that was killed before
/// it could put them back leaves the file, and the next run restores from
/// it first (the values it then reads are the machine's own again).
pub struct SavedSysctls {
    values: Vec<(String, String)>,
    file: PathBuf,
}

impl SavedSysctls {
    /// Restores what an interrupted run saved (if any), then saves the
    /// current values to `file`.
    pub fn save(file: &Path) -> anyhow::Result<Self> {
        if let Ok(text) = std::fs::read_to_string(file) {
            let earlier = SavedSysctls {
                values: serde_json::from_str(&text).unwrap_or_default(),
                file: file.to_path_buf(),
            };
            let changed = earlier.restore();
            if !changed.is_empty() {
                println!(
                    "e2e: put back what an interrupted run changed: {}",
                    changed.join(", ")
                );
            }
        }
        let saved = SavedSysctls {
            values: Self::read(),
            file: file.to_path_buf(),
        };
        std::fs::write(file, serde_json::to_string(&saved.values)?)
            .with_context(|| format!("writing {}", file.display()))?;
        Ok(saved)
    }

    fn read() -> Vec<(String, String)> {
        KUBELET_SYSCTLS
            .iter()
            .chain(WATCHED)
            .map(|key| format!("/proc/sys/{key}"))
            .chain([CONNTRACK_HASHSIZE.to_string()])
            .filter_map(|path| {
                let value = std::fs::read_to_string(&path).ok()?;
                Some((path, value.trim().to_string()))
            })
            .collect()
    }

    /// Writes back every value that changed; the ones that differed, as
    /// `path: was -> had become`.
    pub fn restore(&self) -> Vec<String> {
        let mut changed = Vec::new();
        for (path, saved) in &self.values {
            let now = std::fs::read_to_string(path).unwrap_or_default();
            if now.trim() != saved {
                changed.push(format!("{path} {} -> {saved}", now.trim()));
                let _ = std::fs::write(path, saved);
            }
        }
        changed
    }

    /// Restored for good: the file goes.
    pub fn done(self) {
        self.restore();
        let _ = std::fs::remove_file(&self.file);
    }

    /// An error naming every setting that is not back at its saved value.
    pub fn verify(&self) -> anyhow::Result<()> {
        let wrong: Vec<String> = self
            .values
            .iter()
            .filter_map(|(path, saved)| {
                let now = std::fs::read_to_string(path).unwrap_or_default();
                (now.trim() != saved).then(|| format!("{path} is {} (was {saved})", now.trim()))
            })
            .collect();
        if !wrong.is_empty() {
            bail!("global settings not restored: {}", wrong.join("; "));
        }
        Ok(())
    }
}

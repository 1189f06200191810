//! A flatnet-ipam network on its own (no interfaces), called as a
//! delegating plugin calls it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{CniCall, CniOutput, bin, unique};

/// A flatnet-ipam network on its own (no interfaces): unique name and data
/// dir, removed on drop. `ipam` is the section without `type` and `dataDir`.
pub struct IpamNet {
    pub name: String,
    /// `dataDir`; the records live in `data_dir/name`.
    pub data_dir: PathBuf,
    pub conf: Value,
}

impl IpamNet {
    pub fn new(cni_version: &str, ipam: Value) -> Self {
        let name = unique("ft-ipam-");
        let data_dir = std::env::temp_dir().join(format!("flatnet-test-ipam-{name}"));
        let mut ipam = ipam;
        ipam["type"] = json!("flatnet-ipam");
        ipam["dataDir"] = json!(data_dir.display().to_string());
        let conf = json!({
            "cniVersion": cni_version,
            "name": name,
            "type": "bridge",
            "ipam": ipam,
        });
        IpamNet {
            name,
            data_dir,
            conf,
        }
    }

    pub fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }

    pub fn stdin(&self) -> Vec<u8> {
        self.conf.to_string().into_bytes()
    }

    /// An invocation as a delegating plugin makes it (the runtime's env).
    pub fn cni_call(&self, command: &str, container_id: &str, ifname: &str) -> CniCall {
        CniCall::new(
            command,
            container_id,
            Path::new("/proc/self/ns/net"),
            ifname,
        )
    }

    pub fn call(&self, command: &str, container_id: &str, ifname: &str) -> CniOutput {
        self.cni_call(command, container_id, ifname)
            .run(&bin("flatnet-ipam"), &self.stdin())
    }

    /// Names in the store directory that are addresses (the allocations).
    pub fn allocations(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .names()
            .into_iter()
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect();
        names.sort();
        names
    }

    /// Every name in the store directory.
    pub fn names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.store_dir()) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }
}

impl Drop for IpamNet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

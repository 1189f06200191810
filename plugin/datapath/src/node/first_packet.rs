//! NetworkPolicy from a pod's first packet. The agent learns a pod's
//! address from `status.podIPs`, which kubelet writes only once the
//! sandbox and its containers run: seconds after ADD. Two plain files
//! under /run/flatnet close that gap:
//!
//! - `isolation-<network>.json`, written by the agent: which directions
//!   each namespace has NetworkPolicies for (`listed` false while its
//!   watches have not listed everything yet). ADD starts a new pod of such
//!   a namespace isolated in those directions with an empty table (nothing
//!   allowed) until the agent writes its real policy; a pod no policy
//!   selects is opened again as soon as the agent has seen it.
//! - `pods-<network>/<host veth>`, written by ADD: the pod's namespace,
//!   name and addresses (from `K8S_POD_NAMESPACE`/`K8S_POD_NAME`). The
//!   agent watches the folder and uses these addresses for a local pod
//!   whose status has none yet, for its own table and as a peer in others'.
//!
//! Neither file exists when no agent enforces policy: ADD then isolates
//! nothing, as before.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use flatnet_common::{POLICY_F_EGRESS, POLICY_F_INGRESS};
use serde::{Deserialize, Serialize};

use crate::bpf::pin_name;
use crate::error::Result;
use crate::lock::LOCK_DIR;

/// The directions one namespace's NetworkPolicies isolate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directions {
    #[serde(default)]
    pub ingress: bool,
    #[serde(default)]
    pub egress: bool,
}

/// The agent's `isolation-<network>.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// False until every kind the policy computation needs was listed:
    /// then no namespace can be known to have no policy.
    pub listed: bool,
    /// Namespace -> the directions its policies isolate (namespaces
    /// without NetworkPolicies are left out).
    #[serde(default)]
    pub namespaces: BTreeMap<String, Directions>,
}

pub fn isolation_file(network: &str) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("isolation-{}.json", pin_name(network)))
}

impl Isolation {
    /// What the agent last wrote; None when no agent enforces policy here
    /// (or the file cannot be read, which the agent rewrites at start).
    pub fn read(network: &str) -> Option<Self> {
        let bytes = std::fs::read(isolation_file(network)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The `POLICY_F_*` flags a new pod of `namespace` starts with: the
    /// directions its namespace's policies isolate; both while the agent
    /// has not listed yet (it opens what no policy selects once it has).
    pub fn start_flags(&self, namespace: &str) -> u32 {
        let directions = if self.listed {
            self.namespaces.get(namespace).copied().unwrap_or_default()
        } else {
            Directions {
                ingress: true,
                egress: true,
            }
        };
        let mut flags = 0;
        if directions.ingress {
            flags |= POLICY_F_INGRESS;
        }
        if directions.egress {
            flags |= POLICY_F_EGRESS;
        }
        flags
    }
}

/// Who a local pod is, as ADD was told (`K8S_POD_*` of CNI_ARGS).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
}

/// The folder of `network`'s records.
pub fn records_dir(network: &str) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("pods-{}", pin_name(network)))
}

impl PodRecord {
    /// Writes the record of the attachment behind `host_veth` (write to a
    /// hidden file, rename: the agent never reads half of one).
    pub fn write(&self, network: &str, host_veth: &str) -> Result<()> {
        crate::records::write(&records_dir(network), host_veth, self)
    }

    /// Removes the record of the attachment behind `host_veth`, if any.
    pub fn remove(network: &str, host_veth: &str) {
        let _ = std::fs::remove_file(records_dir(network).join(host_veth));
    }

    /// Every record of `network`, with the host veth it names; unreadable
    /// ones (a crash mid-write leaves only a hidden temp file) skipped.
    pub fn read_all(network: &str) -> Vec<(String, PodRecord)> {
        crate::records::read_all(&records_dir(network))
    }

    /// Removes the records whose host veth `keep` refuses (GC).
    pub fn retain(network: &str, keep: impl Fn(&str) -> bool) {
        for (veth, _) in Self::read_all(network) {
            if !keep(&veth) {
                Self::remove(network, &veth);
            }
        }
    }

    /// Removes the records folder (the network's last pod is gone).
    pub fn remove_all(network: &str) {
        let _ = std::fs::remove_dir_all(records_dir(network));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pod_starts_isolated_as_its_namespace_policies_are() {
        let mut isolation = Isolation {
            listed: true,
            namespaces: BTreeMap::new(),
        };
        isolation.namespaces.insert(
            "locked".into(),
            Directions {
                ingress: true,
                egress: false,
            },
        );
        isolation.namespaces.insert(
            "both".into(),
            Directions {
                ingress: true,
                egress: true,
            },
        );
        assert_eq!(isolation.start_flags("open"), 0);
        assert_eq!(isolation.start_flags("locked"), POLICY_F_INGRESS);
        assert_eq!(
            isolation.start_flags("both"),
            POLICY_F_INGRESS | POLICY_F_EGRESS
        );
        // Before the agent has listed, nothing is known to be open.
        isolation.listed = false;
        assert_eq!(
            isolation.start_flags("open"),
            POLICY_F_INGRESS | POLICY_F_EGRESS
        );
        let text = serde_json::to_string(&isolation).unwrap();
        assert_eq!(serde_json::from_str::<Isolation>(&text).unwrap(), isolation);
    }
}

//! What a pod asks of its sandbox ([`PodSpec`]) and what PodSandboxStatus
//! says of it ([`SandboxStatus`]).

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_cri::v1 as cri;

/// What a pod asks of its sandbox (the parts of a Pod object kubelet puts
/// into PodSandboxConfig).
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub port_mappings: Vec<cri::PortMapping>,
    pub annotations: HashMap<String, String>,
    pub dns: Option<cri::DnsConfig>,
}

impl PodSpec {
    /// A pod `name` in namespace `default` with a fresh UID.
    pub fn new(name: &str) -> Self {
        PodSpec {
            name: name.to_string(),
            namespace: "default".into(),
            uid: crate::unique("uid-"),
            ..Default::default()
        }
    }
}

/// PodSandboxStatus, the parts the tests judge.
#[derive(Debug, Clone)]
pub struct SandboxStatus {
    /// The primary address (`network.ip`), as kubelet puts it into the
    /// Pod's `status.podIP`.
    pub ip: String,
    pub additional_ips: Vec<String>,
    pub state: cri::PodSandboxState,
    /// From the verbose info: the sandbox process and its network namespace.
    pub pid: Option<u32>,
    pub netns: Option<PathBuf>,
}

//! What can go wrong in the agent, by kind, with the context a person
//! needs to fix it.

use std::path::PathBuf;

use flatnet_datapath::netlink::errno;

/// The agent's errors. Datapath and kernel failures carry the plugin's own
/// error (same messages as a CNI ADD would give).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A command-line flag or environment value that cannot work.
    #[error("invalid setting: {0}")]
    Config(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// The static peer file is unreadable or malformed.
    #[error("peer file {}: {reason}", path.display())]
    PeerFile { path: PathBuf, reason: String },

    /// The Kubernetes API client could not be set up.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),

    /// kube's watcher gave up on an attempt (it retries with backoff).
    #[error("kubernetes watch: {0}")]
    Watch(#[from] kube::runtime::watcher::Error),

    #[error("kubeconfig: {0}")]
    KubeConfig(#[from] kube::config::InferConfigError),

    /// Loading, pinning, attaching or a kernel operation (the kernel layer,
    /// flatnet-datapath: the same messages a CNI ADD would give).
    #[error(transparent)]
    Node(#[from] flatnet_datapath::Error),

    /// The network configuration the agent writes did not validate.
    #[error(transparent)]
    NetConf(#[from] flatnet_cni::error::Error),

    /// A route request to the kernel failed.
    #[error("{context}: {reason}")]
    Route { context: String, reason: String },

    /// `--uninstall` could not do every step (each one that failed, why).
    #[error("uninstall incomplete: {0}")]
    Incomplete(String),

    /// The container runtime could not say which sandboxes it has.
    #[error("{0}")]
    Runtime(String),

    /// A reclaim DEL of the conflist's plugins failed (retried next resync).
    #[error("reclaiming {attachment}: {reason}")]
    Reclaim { attachment: String, reason: String },

    /// The peer source stopped for good.
    #[error("peer source ended: {0}")]
    SourceEnded(String),
}

impl AgentError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        AgentError::Io {
            context: context.into(),
            source,
        }
    }

    /// A failed route (or neighbour) request to the kernel, its errno told
    /// as the OS words it.
    pub fn route(context: String, err: rtnetlink::Error) -> Self {
        let reason = match errno(&err) {
            Some(code) => std::io::Error::from_raw_os_error(code).to_string(),
            None => err.to_string(),
        };
        AgentError::Route { context, reason }
    }
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;

//! The crate's errors, one type per part that can fail.

use std::net::SocketAddr;

use hickory_server::net::NetError;
use hickory_server::proto::ProtoError;

/// A `--zone` / `--ttl` that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--zone {zone:?} is not a domain name: {source}")]
    InvalidZone {
        zone: String,
        #[source]
        source: ProtoError,
    },
    #[error("--zone must not be the root zone")]
    RootZone,
    /// The reverse zones are served as well; a cluster zone inside or above
    /// them would make one name belong to two zones.
    #[error("--zone {0} overlaps the reverse zones in-addr.arpa. and ip6.arpa.")]
    OverlapsReverseZones(String),
}

/// The DNS or health listeners.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot bind {protocol} {addr}: {source}")]
    Bind {
        protocol: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the bound address: {0}")]
    LocalAddr(#[source] std::io::Error),
    #[error("the DNS server stopped: {0}")]
    Serve(#[source] NetError),
    #[error("the DNS server stopped without an error")]
    Stopped,
    #[error("the health server stopped: {0}")]
    Health(#[source] std::io::Error),
}

/// The Services / Endpoints watches.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("the Services and Endpoints watch streams ended")]
    Ended,
    #[error("the DNS server is gone (snapshot channel closed)")]
    ServerGone,
}

/// Anything that ends the process.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error("cannot read the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("cannot find API server credentials (kubeconfig or in-cluster): {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot wait for signals: {0}")]
    Signal(#[source] std::io::Error),
}

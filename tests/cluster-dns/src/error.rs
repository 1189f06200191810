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

/// The Services / EndpointSlices watches.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("the Services and EndpointSlices watch streams ended")]
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

/// What the CoreDNS mode supports of a Corefile, quoted by its errors.
pub const COREFILE_SUPPORTED: &str = "supported: server blocks `ZONE[:PORT] {` ... `}` \
     (one zone each, `.` for every name, port 53 by default) holding the plugins \
     `hosts` (a block of inline `IP NAME [NAME...]` entries and an optional \
     `fallthrough`), `log` and `errors`, without arguments; `#` comments";

/// A Corefile the CoreDNS mode cannot serve (see [`COREFILE_SUPPORTED`]).
/// Lines count from 1.
#[derive(Debug, thiserror::Error)]
pub enum CorefileError {
    #[error("line {line}: plugin `{plugin}` is not supported; {supported}", supported = COREFILE_SUPPORTED)]
    UnsupportedPlugin { line: usize, plugin: String },
    #[error("line {line}: {problem}; {supported}", supported = COREFILE_SUPPORTED)]
    Syntax { line: usize, problem: String },
    #[error("line {line}: `{key}` is not a server block key ZONE[:PORT]: {problem}")]
    InvalidKey {
        line: usize,
        key: String,
        problem: String,
    },
    #[error("line {line}: `{text}` is not a hosts entry `IP NAME [NAME...]`: {problem}")]
    InvalidHostsEntry {
        line: usize,
        text: String,
        problem: String,
    },
    #[error(
        "line {line}: `hosts {arguments}`: a hosts file or zone list is not supported, \
         only inline entries: `hosts {{` with one `IP NAME [NAME...]` a line, then `}}`"
    )]
    HostsArguments { line: usize, arguments: String },
    #[error(
        "line {line}: `{option}` in hosts is not supported; only inline entries and a bare `fallthrough` are"
    )]
    UnsupportedHostsOption { line: usize, option: String },
    #[error(
        "line {line}: zone {zone} on port {port} is already served by the block of line {first}"
    )]
    DuplicateZone {
        line: usize,
        zone: String,
        port: u16,
        first: usize,
    },
    #[error("line {line}: the block opened here is not closed")]
    Unclosed { line: usize },
    #[error("the Corefile has no server block; {supported}", supported = COREFILE_SUPPORTED)]
    Empty,
}

/// A command line of the CoreDNS mode that cannot be followed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("flag provided but not supported: {0} (supported: -conf FILE, -help)")]
    Unsupported(String),
    #[error("-conf is given twice")]
    Repeated,
    #[error("no Corefile: give -conf FILE")]
    NoConf,
    #[error("an argument is not UTF-8: {0}")]
    NotUtf8(String),
}

/// Anything that ends the CoreDNS mode.
#[derive(Debug, thiserror::Error)]
pub enum CorednsError {
    #[error("cannot read the Corefile {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serve the Corefile {path}: {source}")]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: CorefileError,
    },
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("cannot wait for signals: {0}")]
    Signal(#[source] std::io::Error),
}

//! Errors of the kernel layer. Each keeps what failed underneath (aya's,
//! netlink's or the OS's error) as its source; the plugin turns them into
//! CNI error codes at the verb boundary, the agent into log lines.

/// Everything that can go wrong in the kernel layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or system call.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A netlink request the kernel refused.
    #[error("{context}: {}", describe_netlink(source))]
    Netlink {
        context: String,
        #[source]
        source: rtnetlink::Error,
    },

    /// Any other kernel operation (a namespace, a sysctl, an ioctl, nft).
    #[error("{context}: {reason}")]
    Kernel { context: String, reason: String },

    /// Loading, pinning, attaching or updating the eBPF datapath, with the
    /// error of aya (or the kernel) that made it fail.
    #[error("eBPF datapath: {context}: {}", chain(source.as_ref()))]
    Bpf {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The datapath is not in a state this build can use.
    #[error("eBPF datapath: {0}")]
    Datapath(String),

    /// What was asked cannot be done with this configuration.
    #[error("invalid network configuration: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and all its sources, "outer: inner: innermost", since library
/// errors (aya's especially) keep the OS error in the source chain.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// The errno of a failed netlink request, if it was one.
pub fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => msg.code.map(|code| -code.get()),
        _ => None,
    }
}

/// A netlink error as the OS names its errno ("File exists"), else as
/// rtnetlink prints it.
fn describe_netlink(err: &rtnetlink::Error) -> String {
    match errno(err) {
        Some(code) => std::io::Error::from_raw_os_error(code).to_string(),
        None => err.to_string(),
    }
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub fn netlink(context: impl Into<String>, source: rtnetlink::Error) -> Self {
        Error::Netlink {
            context: context.into(),
            source,
        }
    }

    pub fn kernel(context: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Kernel {
            context: context.into(),
            reason: reason.to_string(),
        }
    }

    pub fn bpf(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Bpf {
            context: context.into(),
            source: Box::new(source),
        }
    }

    pub fn config(msg: impl Into<String>) -> Self {
        Error::Config(msg.into())
    }

    /// The OS error underneath, if any: callers tell "gone" from "failed".
    pub fn os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Netlink { source, .. } => errno(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpf_errors_keep_their_source_and_print_the_whole_chain() {
        let os = std::io::Error::from_raw_os_error(libc::EPERM);
        let err = Error::bpf("attaching from_pod", os);
        assert!(
            err.to_string()
                .starts_with("eBPF datapath: attaching from_pod: ")
        );
        assert!(err.to_string().contains("Operation not permitted"), "{err}");
        let source = std::error::Error::source(&err).expect("the source is kept");
        assert_eq!(
            source
                .downcast_ref::<std::io::Error>()
                .and_then(|e| e.raw_os_error()),
            Some(libc::EPERM)
        );
    }

    #[test]
    fn io_errors_expose_their_errno() {
        let err = Error::io("reading x", std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(err.os_error(), Some(libc::ENOENT));
        assert_eq!(Error::config("bad").os_error(), None);
    }
}

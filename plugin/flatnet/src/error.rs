//! The verb boundary: the plugin's own errors are CNI errors already;
//! the kernel layer's get their CNI code here, and nowhere else.

use flatnet_cni::error::{Error as CniError, code};
use flatnet_datapath::Error as KernelError;

/// An error of a verb or of the CLI: either a CNI error the plugin raised
/// itself, or one of the kernel layer with its sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cni(#[from] CniError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn config(msg: impl Into<String>) -> Self {
        CniError::config(msg).into()
    }

    pub fn decode(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        CniError::decode(what, reason).into()
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CniError::io(context, source).into()
    }

    pub fn kernel(context: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        KernelError::kernel(context, reason).into()
    }

    /// The datapath is not in a state this build can use.
    pub fn datapath(msg: impl Into<String>) -> Self {
        KernelError::Datapath(msg.into()).into()
    }

    pub fn invalid_env(name: &'static str, reason: impl Into<String>) -> Self {
        CniError::invalid_env(name, reason).into()
    }

    /// The CNI error code this error is reported with.
    pub fn code(&self) -> u32 {
        match self {
            Error::Cni(err) => err.code(),
            Error::Kernel(err) => kernel_code(err),
        }
    }
}

/// The CNI code of a kernel-layer error: configuration it cannot serve,
/// I/O, the eBPF datapath, or the kernel's networking.
fn kernel_code(err: &KernelError) -> u32 {
    match err {
        KernelError::Config(_) => code::INVALID_CONFIG,
        KernelError::Io { .. } => code::IO_FAILURE,
        KernelError::Bpf { .. } | KernelError::Datapath(_) => code::DATAPATH,
        KernelError::Netlink { .. } | KernelError::Kernel { .. } => code::KERNEL,
    }
}

impl From<Error> for CniError {
    fn from(err: Error) -> Self {
        match err {
            Error::Cni(err) => err,
            Error::Kernel(KernelError::Io { context, source }) => CniError::Io { context, source },
            Error::Kernel(KernelError::Config(msg)) => CniError::InvalidConfig(msg),
            Error::Kernel(err) => CniError::Layer {
                code: kernel_code(&err),
                source: Box::new(err),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_errors_get_their_cni_code_and_keep_their_source() {
        let os = std::io::Error::from_raw_os_error(libc::EPERM);
        let cni: CniError = Error::from(KernelError::bpf("attaching from_pod", os)).into();
        assert_eq!(cni.code(), code::DATAPATH);
        assert!(cni.to_string().contains("attaching from_pod"), "{cni}");
        assert!(std::error::Error::source(&cni).is_some());
        let cni: CniError = Error::kernel("adding a route", "File exists").into();
        assert_eq!(cni.code(), code::KERNEL);
        assert_eq!(cni.to_string(), "adding a route: File exists");
        let cni: CniError = Error::from(KernelError::config("two datapaths")).into();
        assert_eq!(cni.code(), code::INVALID_CONFIG);
        let io = KernelError::io("reading x", std::io::Error::from_raw_os_error(libc::ENOENT));
        let cni: CniError = Error::from(io).into();
        assert_eq!(cni.code(), code::IO_FAILURE);
        assert!(cni.details().contains("os error"), "{}", cni.details());
    }
}

//! CNI errors: one typed error for the whole plugin, each variant mapped to a
//! CNI error code, printed as the spec's error object.

use serde::{Deserialize, Serialize};

/// Well-known CNI error codes (spec "Well-known Error Codes") and flatnet's own (>= 100).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD.
    pub const NOT_READY: u32 = 50;
    /// STATUS: not ready, and existing containers may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// A kernel networking operation (netlink, sysctl, namespace) failed.
    pub const KERNEL: u32 = 100;
    /// Loading, pinning, attaching or updating the eBPF datapath failed.
    pub const DATAPATH: u32 = 101;
    /// CHECK found the attachment differs from what ADD set up.
    pub const CHECK_MISMATCH: u32 = 102;
    /// A delegated plugin (IPAM) could not be run or answered nonsense.
    pub const DELEGATE: u32 = 103;
    /// IPAM: no address left in a range.
    pub const POOL_EXHAUSTED: u32 = 110;
    /// IPAM: a requested address is already allocated.
    pub const ADDRESS_TAKEN: u32 = 111;
    /// IPAM: the allocation store is unreadable or unwritable.
    pub const STORE: u32 = 112;
}

/// Everything that can go wrong in flatnet and flatnet-ipam.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("incompatible CNI version {requested:?}: this plugin supports {supported}")]
    IncompatibleVersion {
        requested: String,
        supported: String,
    },

    #[error("unsupported field {field:?} = {value}: {hint}")]
    UnsupportedField {
        field: String,
        value: String,
        hint: String,
    },

    #[error("{0}")]
    UnknownContainer(String),

    #[error("invalid environment variable {name}: {reason}")]
    InvalidEnv { name: &'static str, reason: String },

    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },

    #[error("cannot decode {what}: {reason}")]
    Decode { what: String, reason: String },

    #[error("invalid network configuration: {0}")]
    InvalidConfig(String),

    #[error("{0}")]
    TryAgainLater(String),

    #[error("{0}")]
    NotReady(String),

    #[error("{context}: {reason}")]
    Kernel { context: String, reason: String },

    #[error("eBPF datapath: {0}")]
    Datapath(String),

    #[error("{0}")]
    CheckMismatch(String),

    /// An error object returned by a delegated plugin, passed on with its own code.
    #[error("{plugin}: {msg}")]
    Delegated {
        plugin: String,
        code: u32,
        msg: String,
        details: String,
    },

    #[error("{0}")]
    Delegate(String),

    #[error("{0}")]
    PoolExhausted(String),

    #[error("{0}")]
    AddressTaken(String),

    #[error("IPAM store: {0}")]
    Store(String),

    /// An error of a lower layer (the kernel's, the eBPF datapath's), kept
    /// with its sources, reported with the code the plugin chose for it;
    /// its own message already names what failed underneath.
    #[error("{source}")]
    Layer {
        code: u32,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn code(&self) -> u32 {
        match self {
            Error::IncompatibleVersion { .. } => code::INCOMPATIBLE_VERSION,
            Error::UnsupportedField { .. } => code::UNSUPPORTED_FIELD,
            Error::UnknownContainer(_) => code::UNKNOWN_CONTAINER,
            Error::InvalidEnv { .. } => code::INVALID_ENV,
            Error::Io { .. } => code::IO_FAILURE,
            Error::Decode { .. } => code::DECODE_FAILURE,
            Error::InvalidConfig(_) => code::INVALID_CONFIG,
            Error::TryAgainLater(_) => code::TRY_AGAIN_LATER,
            Error::NotReady(_) => code::NOT_READY,
            Error::Kernel { .. } => code::KERNEL,
            Error::Datapath(_) => code::DATAPATH,
            Error::CheckMismatch(_) => code::CHECK_MISMATCH,
            Error::Delegated { code, .. } => *code,
            Error::Delegate(_) => code::DELEGATE,
            Error::PoolExhausted(_) => code::POOL_EXHAUSTED,
            Error::AddressTaken(_) => code::ADDRESS_TAKEN,
            Error::Store(_) => code::STORE,
            Error::Layer { code, .. } => *code,
        }
    }

    /// Extra detail for the error object: what a person should do about it.
    pub fn details(&self) -> String {
        match self {
            Error::Delegated { details, .. } => details.clone(),
            Error::Io { source, .. } => format!("os error: {source}"),
            _ => String::new(),
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
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

    pub fn invalid_env(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidEnv {
            name,
            reason: reason.into(),
        }
    }

    pub fn config(msg: impl Into<String>) -> Self {
        Error::InvalidConfig(msg.into())
    }

    pub fn decode(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Decode {
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    /// The spec's error object, for stdout.
    pub fn to_object(&self, cni_version: &str) -> ErrorObject {
        ErrorObject {
            cni_version: cni_version.to_string(),
            code: self.code(),
            msg: self.to_string(),
            details: self.details(),
        }
    }
}

/// The JSON error object of the CNI spec.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorObject {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    pub code: u32,
    #[serde(default)]
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_carries_code_message_and_details() {
        let err = Error::Delegated {
            plugin: "host-local".into(),
            code: 11,
            msg: "busy".into(),
            details: "retry".into(),
        };
        let obj = err.to_object("1.0.0");
        assert_eq!(obj.code, 11);
        assert_eq!(obj.msg, "host-local: busy");
        let json = serde_json::to_value(&obj).unwrap();
        assert_eq!(json["cniVersion"], "1.0.0");
        assert_eq!(json["details"], "retry");
    }

    #[test]
    fn empty_details_are_omitted() {
        let obj = Error::config("bad").to_object("1.0.0");
        let json = serde_json::to_value(&obj).unwrap();
        assert_eq!(json["code"], 7);
        assert!(json.get("details").is_none());
    }
}

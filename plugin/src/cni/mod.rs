//! The CNI protocol: environment, configuration, results, versions, errors.

pub mod config;
pub mod env;
pub mod error;
pub mod result;
pub mod runtime;
pub mod version;

//! The maps and the constants the loader sets, each map sized by and
//! checked against its spec in `flatnet_common::maps` (the loader checks
//! pinned maps against the same). Kept below the logic: the feature
//! modules import these, these import nothing of theirs.

pub(crate) mod endpoints;
pub(crate) mod flow;
pub(crate) mod nodeport;
pub(crate) mod policy;
pub(crate) mod remote;
pub(crate) mod services;

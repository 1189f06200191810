//! The CNI protocol, as any plugin speaks it: the environment (`env`), the
//! checks every configuration gets (`config`), `runtimeConfig` and
//! `CNI_ARGS` (`runtime`), hostPorts (`port_mappings`), results (`result`), versions (`version`), error
//! objects and codes (`error`), and the `runner` that turns one invocation
//! into its answer and exit status.

pub mod config;
pub mod env;
pub mod error;
pub mod port_mappings;
pub mod result;
pub mod runner;
pub mod runtime;
pub mod version;

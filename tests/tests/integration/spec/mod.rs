//! Spec coverage of the flatnet plugin as a runtime drives it: every version
//! (result shapes), prevResult when flatnet runs later in a chain,
//! runtimeConfig/args/CNI_ARGS, CHECK per version, DNS, STATUS and GC.
//!
//! The tests by what they prove: `versions` (every version, VERSION,
//! DNS, `cniVersions`), `inputs` (prevResult, runtimeConfig, args,
//! CNI_ARGS) and `status_and_gc`. Their shared helpers are in `fixture`.

mod fixture;

mod inputs;
mod status_and_gc;
mod versions;

//! The scale harness's parts (`cargo xtask scale`, the `flatnet-scale`
//! binary): the synthetic cluster of each size, its churn, and what is
//! read off the agent (its process, its metrics, its maps).

pub mod api;
pub mod churn;
pub mod measure;
pub mod objects;
pub mod real_api;
mod writer;

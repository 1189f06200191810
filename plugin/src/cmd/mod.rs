//! One handler per CNI verb. What they share about a network's life on the
//! node is in `crate::network`.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod plan;
pub mod status;

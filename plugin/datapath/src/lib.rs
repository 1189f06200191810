//! flatnet's kernel layer, shared by the plugin and the agent: the eBPF
//! datapath (`bpf`: the object, its maps and attachments), rtnetlink objects
//! (`netlink`: links, addresses, routes, neighbours, qdiscs, sysctls),
//! network namespaces (`netns`), the node's locks (`lock`), masquerade
//! rules (`masquerade`), and a network's life on a node (`node`: loading
//! the datapath on first use, rebuilding it, releasing it when empty), and
//! connected sockets destroyed through sock_diag (`sockets`).
//!
//! It knows nothing of CNI: its [`Error`] keeps the underlying errors as
//! sources, and the plugin maps them to CNI codes at the verb boundary.

pub mod bpf;
pub mod error;
pub mod lock;
pub mod masquerade;
mod mode;
pub mod netlink;
pub mod netns;
pub mod nft_generation;
pub mod node;
pub mod records;
pub mod sockets;
pub mod trace;
pub mod util;

pub use error::{Error, Result};
pub use mode::{DatapathMode, Shaping};

//! Driving flatnet from outside, the way a runtime and an operator do:
//! network namespaces that remove themselves, commands run and their output
//! collected, CNI plugins called with env + stdin (optionally entered into a
//! node's namespace), configuration lists run the way libcni runs them,
//! unique names, waiting for a condition, and the rule for a test that
//! cannot run here.
//!
//! Shared by the integration tests (`flatnet-tests`, which re-exports it)
//! and xtask (demo, bench). It depends on nothing of flatnet's: xtask
//! builds it before `cargo xtask setup` has installed bpf-linker, which
//! the `flatnet` crate's build script needs.

mod cni;
mod command;
mod conflist;
pub mod containerd;
mod leftovers;
mod made_here;
mod netns;
mod node_objects;
mod require;
mod signals;
mod wait;

use std::sync::atomic::{AtomicU32, Ordering};

pub use cni::{
    CniCall, CniOutput, REFERENCE_PLUGINS, bin_dir, cni_path, find_plugin, result_ips,
    run_with_stdin,
};
pub use command::{CommandError, bpftool, describe, output, run_ok};
pub use conflist::{ChainError, Conflist};
pub use leftovers::{in_removal_order, kill_and_remove_cgroup, remove_object};
pub use made_here::{Listed, made_here, mount_made, remove_on_signal};
pub use netns::{Netns, enter, enter_thread};
pub use node_objects::{NodeObjects, SETTLE_AFTER_RUN, left_since};
pub use require::{REQUIRE_ROOT_ENV, Verdict, is_root, require, verdict};
pub use signals::{ReadThroughSignals, RecvThroughSignals};
pub use wait::{POLL_INTERVAL, poll_until, wait_until};

/// A short name unique to this process and call: `<prefix><pid><n>` in hex.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:x}", std::process::id() & 0xfffff)
}

#[cfg(test)]
mod tests {
    use super::unique;

    #[test]
    fn unique_names_differ_and_keep_their_prefix() {
        let (a, b) = (unique("ft-"), unique("ft-"));
        assert_ne!(a, b);
        assert!(a.starts_with("ft-") && b.starts_with("ft-"));
    }
}

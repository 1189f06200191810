//! The critest machine's fixed names and paths, named by the machine, by
//! its clean-up and by the runtime CNI checks: its name, its state folder,
//! its CRI socket, and the log flatnet's runner writes in it.

/// The machine's name (its network namespace, its hostname).
pub const NAME: &str = "flatnet-critest";
/// Its state (removed after each run).
pub const STATE_DIR: &str = "/var/tmp/flatnet-critest";
/// The CRI socket, inside the machine.
pub const SOCKET: &str = "/run/containerd/containerd.sock";
/// Where flatnet's runner writes one line per invocation, in the machine.
pub const CNI_LOG: &str = "/var/lib/cni/flatnet-cni.log";

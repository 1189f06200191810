//! A real containerd (1.6, Debian's package) with its CRI plugin: the
//! container runtime of a Kubernetes node, which runs the node's CNI
//! conflist through libcni for every pod sandbox kubelet asks for.
//!
//! [`Containerd`] starts one that only its test uses: its own root, state,
//! socket and config file under a fresh temporary directory, the CNI conf
//! and bin dirs the test gives, runc's state under its state dir. On drop,
//! every sandbox still there is stopped and removed through CRI (so CNI
//! DEL runs), then containerd and its shims are killed, everything mounted
//! under its directories is unmounted and the directories removed, and the
//! few machine paths containerd creates whatever its configuration says are
//! removed again when the tests made them.
//!
//! [`TestImages`] are the images a node would pull: a pause-like sandbox
//! image and busybox for app containers, both written here as an OCI image
//! layout (no registry, no podman) from busybox-static, and imported with
//! `ctr images import` into the `k8s.io` namespace, where CRI looks.

mod daemon;
mod images;
mod machine_paths;
mod teardown;

pub use daemon::Containerd;
pub use images::TestImages;

/// The pause-like sandbox image: waits forever, exits on SIGTERM (PID 1 of
/// its PID namespace gets only the signals it handles, hence the trap).
pub const PAUSE_IMAGE: &str = "localhost/flatnet-test-pause:1";
/// busybox-static with its applet links, for app containers.
pub const BUSYBOX_IMAGE: &str = "localhost/flatnet-test-busybox:1";

const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";
const RUNC: &str = "/usr/sbin/runc";
const SHIM: &str = "containerd-shim-runc-v2";
/// Where shims listen, whatever containerd's state dir.
const SHIM_SOCKETS: &str = "/run/containerd/s";

/// What the CRI tests need on the machine: (path, Debian package).
pub const TOOLS: &[(&str, &str)] = &[
    (CONTAINERD, "containerd"),
    (CTR, "containerd"),
    (RUNC, "runc"),
    ("/bin/busybox", "busybox-static"),
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

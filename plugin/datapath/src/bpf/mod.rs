//! The eBPF datapath of one network: the object embedded in this binary, its
//! programs and maps pinned under /sys/fs/bpf/flatnet/<network>/ (the root
//! can be moved), one file per concern: bpffs, loading and pinning (with the
//! kfunc calls resolved for this kernel), program attachment, the endpoint
//! maps, counter slots, the pods' source addresses, counters, and the
//! remote-CIDR tries.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use aya::include_bytes_aligned;
use aya::maps::MapData;
use aya::programs::{ProgramFd, ProgramInfo};
use flatnet_common::{
    MAPS, PIN_ROOT, PROG_FROM_POD, PROG_FROM_POD_PASSED, PROG_FROM_POD_XDP, PROG_FROM_TUNNEL,
    PROG_FROM_UPLINK, PROG_NODEPORT_IN, PROG_NODEPORT_REPLY, PROG_POD_XDP_PASS, PROG_TO_POD,
    PROG_TO_UPLINK, PROG_UPLINK_DELIVER,
};

use crate::DatapathMode;
use crate::error::{Error, Result};

pub use crate::Shaping;

mod attach;
mod bpffs;
mod endpoints;
mod events;
mod flows;
mod host_ports;
mod host_veth;
pub mod kfunc;
mod load;
mod nat;
mod policy;
mod remote;
mod service_programs;
mod services;
pub mod sizes;
mod slots;
mod sources;
mod stats;
mod typed;
mod variant;

pub use attach::{ATTACH_ENV, AttachMode, LinkRole, attach_mode, hook_programs, ingress_programs};
pub use bpffs::{bpffs_is_mounted, ensure_bpffs_at};
pub use events::PolicyEvents;
pub use flows::flow_key;
pub use host_ports::HostPort;
pub use host_veth::{
    attach_filter, attach_host_veth, attach_xdp_then_filter, move_to_tcx, move_xdp_mode_to_tcx,
    prepare_pod_for_xdp,
};
pub use nat::{NatFlow, OrphanReply, orphan_replies};
pub use policy::{
    PeerRule, PolicyDropCounts, PolicyPortRange, PolicyPorts, PolicyRule, PolicyTable,
    local_addr_key, ports_value,
};
pub use remote::{RemoteCidr, RemoteWritten};
pub use service_programs::SERVICE_PROGRAMS;
pub use services::{
    Outside, backend_address, frontend_of, protocol_name, service_backend, service_key,
};
pub use sources::sources_of;
pub use variant::CostVariant;

/// The datapath object, built by build.rs for bpfel-unknown-none with BTF.
static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flatnet-ebpf"));

/// The embedded datapath object, as built (kfunc calls unresolved).
pub fn object() -> &'static [u8] {
    OBJECT
}

/// A short hash of `OBJECT`: pinned programs carry it in their name.
pub const DATAPATH_ID: &str = env!("FLATNET_DATAPATH_ID");

/// The version the binaries print: the release and the datapath build in it.
pub const BUILD_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " datapath ",
    env!("FLATNET_DATAPATH_ID")
);

/// tc filter priority and handle of `from_pod` on every host veth: fixed, so
/// CHECK can find it and an upgrade can replace it in place.
pub const TC_PRIORITY: u16 = 1;

pub const TC_HANDLE: u32 = 1;

/// Moves the pin root (default /sys/fs/bpf/flatnet) for the plugin and the
/// agent alike: one machine can then host several simulated nodes, each
/// with pins of its own.
pub const PIN_ROOT_ENV: &str = "FLATNET_PIN_ROOT";

/// `FLATNET_PIN_ROOT`, when set.
fn pin_root_from_env() -> Option<PathBuf> {
    std::env::var_os(PIN_ROOT_ENV)
        .filter(|root| !root.is_empty())
        .map(PathBuf::from)
}

/// Where networks are pinned when no configuration says: `FLATNET_PIN_ROOT`
/// when set, else `PIN_ROOT` (`flatnet inspect`, tests).
pub fn pin_root() -> PathBuf {
    pin_root_from_env().unwrap_or_else(|| PathBuf::from(PIN_ROOT))
}

/// Where a network whose configuration says `configured` (`pinRoot`) is
/// pinned. A runtime runs the plugin with the node's conflist, which the
/// agent wrote with its own pin root: that one wins. `FLATNET_PIN_ROOT`
/// may say the same, but not something else: a plugin pinning elsewhere
/// than the agent would split the node's datapath in two (pods in maps the
/// uplink program never reads), so that is refused.
pub fn pin_root_for(configured: Option<&Path>) -> Result<PathBuf> {
    match (configured, pin_root_from_env()) {
        (Some(conf), Some(env)) if conf != env => Err(Error::config(format!(
            "{PIN_ROOT_ENV}={} disagrees with the configuration's \"pinRoot\" {}: the plugin and the node agent must pin in one place; unset {PIN_ROOT_ENV}",
            env.display(),
            conf.display()
        ))),
        (Some(conf), _) => Ok(conf.to_path_buf()),
        (None, _) => Ok(pin_root()),
    }
}

/// The programs a mode loads: the first goes on host veths (XDP mode's
/// with `from_pod_passed` at tc ingress behind it); `from_uplink` and
/// `to_uplink` (the node agent puts them on the uplink), `to_pod` and the
/// NodePort path's tail calls are the same in both modes.
pub fn programs(mode: DatapathMode) -> &'static [&'static str] {
    match mode {
        DatapathMode::Tc => &[
            PROG_FROM_POD,
            PROG_FROM_UPLINK,
            PROG_TO_POD,
            PROG_TO_UPLINK,
            PROG_FROM_TUNNEL,
            PROG_NODEPORT_REPLY,
            PROG_NODEPORT_IN,
            PROG_UPLINK_DELIVER,
        ],
        DatapathMode::Xdp => &[
            PROG_FROM_POD_XDP,
            PROG_POD_XDP_PASS,
            PROG_FROM_UPLINK,
            PROG_TO_POD,
            PROG_TO_UPLINK,
            PROG_FROM_TUNNEL,
            PROG_FROM_POD_PASSED,
            PROG_NODEPORT_REPLY,
            PROG_NODEPORT_IN,
            PROG_UPLINK_DELIVER,
        ],
    }
}

/// True when the embedded object is an eBPF ELF (STATUS reports it).
pub fn object_is_ebpf() -> bool {
    // e_machine EM_BPF = 247, little endian.
    OBJECT.len() > 20
        && OBJECT[..4] == *b"\x7fELF"
        && u16::from_le_bytes([OBJECT[18], OBJECT[19]]) == 247
}

/// bpffs refuses '.' in names (reserved for the kernel); network names may
/// contain it. '~' cannot appear in a network name, so the mapping is one-to-one.
pub fn pin_name(network: &str) -> String {
    network.replace('.', "~")
}

/// A pinned program, open: its descriptor (for attaching) and its ID.
pub struct ProgramHandle {
    info: ProgramInfo,
    fd: ProgramFd,
}

impl ProgramHandle {
    pub fn raw_fd(&self) -> Result<RawFd> {
        Ok(self.fd.as_fd().as_raw_fd())
    }

    pub fn id(&self) -> Result<u32> {
        Ok(self.info.id())
    }
}

/// One network's pinned datapath.
#[derive(Debug, Clone)]
pub struct Datapath {
    root: PathBuf,
    dir: PathBuf,
    /// How its maps are sized when they are made (see `sizes`).
    sizing: sizes::MapSizing,
}

impl Datapath {
    /// The network's datapath under the pin root in force (see `pin_root`).
    pub fn new(network: &str) -> Self {
        Self::with_root(&pin_root(), network)
    }

    /// The datapath of `network`, pinned where its configuration says (see
    /// `pin_root_for`).
    pub fn for_network(network: &crate::node::NodeNetwork) -> Result<Self> {
        Ok(
            Self::with_root(&pin_root_for(network.pin_root.as_deref())?, &network.name)
                .sized(&network.map_sizing),
        )
    }

    /// The network's datapath under an explicit pin root.
    pub fn with_root(root: &Path, network: &str) -> Self {
        Datapath {
            root: root.to_path_buf(),
            dir: root.join(pin_name(network)),
            sizing: sizes::MapSizing::default(),
        }
    }

    /// This datapath, its maps made with `sizing` when it is loaded (maps
    /// already pinned keep their size).
    pub fn sized(mut self, sizing: &sizes::MapSizing) -> Self {
        self.sizing = sizing.clone();
        self
    }

    /// How many entries the pinned map `name` holds at most: its size as
    /// made, which `sizes` decides for the maps sized per node.
    pub fn capacity(&self, name: &str) -> Result<Option<u32>> {
        Ok(self.pinned_map_info(name)?.map(|info| info.max_entries()))
    }

    /// The pin root this network's directory is in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn pin_dir(&self) -> &Path {
        &self.dir
    }

    /// Where this build pins `program`.
    pub fn program_path(&self, program: &str) -> PathBuf {
        self.dir.join(format!("{program}-{DATAPATH_ID}"))
    }

    pub fn map_path(&self, map: &str) -> PathBuf {
        self.dir.join(map)
    }

    /// True when this build's programs for `mode` are pinned (maps come first).
    pub fn is_loaded(&self, mode: DatapathMode) -> bool {
        programs(mode).iter().all(|p| self.program_path(p).exists())
    }

    /// True when anything of this network is pinned at all.
    pub fn exists(&self) -> bool {
        self.dir.exists()
    }

    /// The mode whose programs (of any build) are pinned, if any.
    pub fn pinned_mode(&self) -> Option<DatapathMode> {
        let names = self.pinned_programs();
        // from_pod_xdp-* also starts with "from_pod": test the longer name first.
        if names
            .iter()
            .any(|n| n.starts_with(&format!("{PROG_FROM_POD_XDP}-")))
        {
            Some(DatapathMode::Xdp)
        } else if names
            .iter()
            .any(|n| n.starts_with(&format!("{PROG_FROM_POD}-")))
        {
            Some(DatapathMode::Tc)
        } else {
            None
        }
    }

    /// Names of the pinned programs (every pin that is not a map).
    /// The build of the programs pinned here when it is not this one's
    /// (`from_pod-<id>`): None when this build's are pinned, or none are.
    pub fn other_pinned_build(&self) -> Option<String> {
        let pinned = self.pinned_programs();
        if pinned
            .iter()
            .any(|name| name.ends_with(&format!("-{DATAPATH_ID}")))
        {
            return None;
        }
        pinned
            .iter()
            .filter_map(|name| name.rsplit_once('-').map(|(_, id)| id))
            .find(|id| id.len() == DATAPATH_ID.len() && id.chars().all(|c| c.is_ascii_hexdigit()))
            .map(str::to_string)
    }

    pub fn pinned_programs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        // Directories (links/) are not programs.
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !MAPS.contains(&name.as_str()))
            .collect()
    }

    fn open_map(&self, name: &str) -> Result<MapData> {
        let path = self.map_path(name);
        MapData::from_pin(&path).map_err(|e| Error::bpf(format!("opening {}", path.display()), e))
    }

    /// Unpins everything of this network. Attached programs keep their own
    /// references, so this never breaks a veth that still exists.
    pub fn remove_pins(&self) -> Result<()> {
        let _ = std::fs::remove_dir_all(self.slots_dir());
        // The hostPort records describe frontends in these maps: they go
        // with them, and so does their lock.
        self.remove_host_port_records()?;
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", self.dir.display()), e)),
        }
    }
}

fn ignore_missing(outcome: std::result::Result<(), aya::maps::MapError>) -> Result<()> {
    match outcome {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        // A delete of a key that is not there comes back as ENOENT.
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        Err(e) => Err(Error::bpf("removing a map entry", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_live_under_the_network_directory() {
        let dp = Datapath::new("pods");
        assert_eq!(dp.pin_dir(), Path::new("/sys/fs/bpf/flatnet/pods"));
        assert_eq!(
            dp.program_path(PROG_FROM_POD),
            Path::new(&format!("/sys/fs/bpf/flatnet/pods/from_pod-{DATAPATH_ID}"))
        );
        assert_eq!(
            dp.map_path("STATS"),
            Path::new("/sys/fs/bpf/flatnet/pods/STATS")
        );
        assert_eq!(
            Datapath::new("a.b").pin_dir(),
            Path::new("/sys/fs/bpf/flatnet/a~b")
        );
    }

    #[test]
    fn each_mode_names_its_programs() {
        assert_eq!(
            programs(DatapathMode::Tc),
            [
                PROG_FROM_POD,
                PROG_FROM_UPLINK,
                PROG_TO_POD,
                PROG_TO_UPLINK,
                PROG_FROM_TUNNEL,
                PROG_NODEPORT_REPLY,
                PROG_NODEPORT_IN,
                PROG_UPLINK_DELIVER
            ]
        );
        assert_eq!(
            programs(DatapathMode::Xdp),
            [
                PROG_FROM_POD_XDP,
                PROG_POD_XDP_PASS,
                PROG_FROM_UPLINK,
                PROG_TO_POD,
                PROG_TO_UPLINK,
                PROG_FROM_TUNNEL,
                PROG_FROM_POD_PASSED,
                PROG_NODEPORT_REPLY,
                PROG_NODEPORT_IN,
                PROG_UPLINK_DELIVER
            ]
        );
    }

    #[test]
    fn an_explicit_root_moves_the_pins() {
        let dp = Datapath::with_root(Path::new("/tmp/bpf/node1"), "a.b");
        assert_eq!(dp.pin_dir(), Path::new("/tmp/bpf/node1/a~b"));
    }
}

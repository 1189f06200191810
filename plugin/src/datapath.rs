//! The eBPF datapath of one network: the object embedded in this binary, its
//! programs and maps pinned under /sys/fs/bpf/flatnet/<network>/ (the root
//! can be moved with `FLATNET_PIN_ROOT`), program attachment on host veths,
//! and the endpoint, counter and remote-CIDR maps.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, Map, MapData, MapInfo, PerCpuArray, PerCpuValues};
use aya::programs::{Program, ProgramFd, ProgramInfo};
use aya::util::nr_cpus;
use aya::{EbpfLoader, include_bytes_aligned};
use flatnet_common::{
    Counter, Endpoint, EndpointCounters, FlowKey, FlowVerdict, GLOBAL_UPLINK_TO_PODS, Ipv4Key,
    Ipv6Key, MAP_ENDPOINT_STATS, MAP_ENDPOINTS_V4, MAP_ENDPOINTS_V6, MAP_HOST_VETHS,
    MAP_POD_SOURCES, MAP_REMOTE_CIDRS_V4, MAP_REMOTE_CIDRS_V6, MAP_STATS, MAP_TCP_FLOWS, MAPS,
    MAX_ENDPOINTS, NO_COUNTER_SLOT, PIN_ROOT, PROG_FROM_POD, PROG_FROM_POD_XDP, PROG_FROM_UPLINK,
    PROG_POD_XDP_PASS, PodSources, RemoteCidrV4, RemoteCidrV6, RemoteNode, SOURCES_F_MORE,
    SOURCES_F_VALID, SOURCES_PER_FAMILY, action,
};
use ipnetwork::IpNetwork;

use crate::cni::config::DatapathMode;
use crate::cni::error::{Error, Result, chain};
use crate::lock::{LOCK_DIR, Lock};

/// The datapath object, built by build.rs for bpfel-unknown-none with BTF.
static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flatnet-ebpf"));

/// The embedded datapath object, as built (kfunc calls unresolved).
pub fn object() -> &'static [u8] {
    OBJECT
}

/// A short hash of `OBJECT`: pinned programs carry it in their name.
pub const DATAPATH_ID: &str = env!("FLATNET_DATAPATH_ID");

/// tc filter priority and handle of `from_pod` on every host veth: fixed, so
/// CHECK can find it and an upgrade can replace it in place.
pub const TC_PRIORITY: u16 = 1;
pub const TC_HANDLE: u32 = 1;

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// Moves the pin root (default /sys/fs/bpf/flatnet) for the plugin and the
/// agent alike: one machine can then host several simulated nodes, each
/// with pins of its own.
pub const PIN_ROOT_ENV: &str = "FLATNET_PIN_ROOT";

/// Where networks are pinned: `FLATNET_PIN_ROOT` when set, else `PIN_ROOT`.
pub fn pin_root() -> PathBuf {
    std::env::var_os(PIN_ROOT_ENV)
        .filter(|root| !root.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(PIN_ROOT))
}

/// (map, key size, value size) as this build's programs expect them.
const MAP_LAYOUTS: [(&str, u32, u32); 9] = [
    (
        MAP_ENDPOINTS_V4,
        size_of::<Ipv4Key>() as u32,
        size_of::<Endpoint>() as u32,
    ),
    (
        MAP_ENDPOINTS_V6,
        size_of::<Ipv6Key>() as u32,
        size_of::<Endpoint>() as u32,
    ),
    (
        MAP_HOST_VETHS,
        size_of::<u32>() as u32,
        size_of::<Endpoint>() as u32,
    ),
    (
        MAP_STATS,
        size_of::<u32>() as u32,
        size_of::<Counter>() as u32,
    ),
    (
        MAP_ENDPOINT_STATS,
        size_of::<u32>() as u32,
        size_of::<EndpointCounters>() as u32,
    ),
    (
        MAP_POD_SOURCES,
        size_of::<u32>() as u32,
        size_of::<PodSources>() as u32,
    ),
    (
        MAP_TCP_FLOWS,
        size_of::<FlowKey>() as u32,
        size_of::<FlowVerdict>() as u32,
    ),
    // LPM keys: a u32 prefix length, then the address.
    (
        MAP_REMOTE_CIDRS_V4,
        (size_of::<u32>() + size_of::<RemoteCidrV4>()) as u32,
        size_of::<RemoteNode>() as u32,
    ),
    (
        MAP_REMOTE_CIDRS_V6,
        (size_of::<u32>() + size_of::<RemoteCidrV6>()) as u32,
        size_of::<RemoteNode>() as u32,
    ),
];

/// `AF_INET`/`AF_INET6` as `RemoteNode::family` holds them.
const FAMILY_INET: u32 = libc::AF_INET as u32;
const FAMILY_INET6: u32 = libc::AF_INET6 as u32;

fn datapath_err(context: &str, err: impl std::error::Error) -> Error {
    Error::Datapath(format!("{context}: {}", chain(&err)))
}

/// The programs a mode loads: the first goes on host veths; `from_uplink`
/// (the node agent puts it on the uplink) is the same in both modes.
pub fn programs(mode: DatapathMode) -> &'static [&'static str] {
    match mode {
        DatapathMode::Tc => &[PROG_FROM_POD, PROG_FROM_UPLINK],
        DatapathMode::Xdp => &[PROG_FROM_POD_XDP, PROG_POD_XDP_PASS, PROG_FROM_UPLINK],
    }
}

/// The nearest existing ancestor of `path` (itself included).
fn existing_ancestor(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.exists())
}

/// True when `path` (or, while it does not exist yet, its nearest existing
/// ancestor) is on a bpf file system.
fn on_bpffs(path: &Path) -> bool {
    existing_ancestor(path).is_some_and(|p| {
        nix::sys::statfs::statfs(p).is_ok_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
    })
}

/// Mounts bpffs at /sys/fs/bpf unless it already is, as production CNIs do:
/// without it nothing can be pinned and every ADD would reload the programs.
/// A pin root moved elsewhere (`FLATNET_PIN_ROOT`) must already be on a
/// bpffs: flatnet mounts only at the standard place.
pub fn ensure_bpffs() -> Result<()> {
    ensure_bpffs_at(&pin_root())
}

/// `ensure_bpffs` for an explicit pin root (the agent's `--pin-root`).
pub fn ensure_bpffs_at(root: &Path) -> Result<()> {
    if !root.starts_with(BPFFS_MOUNT) {
        if on_bpffs(root) {
            return Ok(());
        }
        return Err(Error::Datapath(format!(
            "the pin root {} is not on a bpf file system: mount one there (mount -t bpf bpf DIR) or unset {PIN_ROOT_ENV}",
            root.display()
        )));
    }
    let is_bpffs = || {
        nix::sys::statfs::statfs(BPFFS_MOUNT)
            .map(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
            .unwrap_or(false)
    };
    if is_bpffs() {
        return Ok(());
    }
    // Two plugins mounting at once would stack two bpffs; one mounts, under a lock.
    let _lock = Lock::exclusive("bpffs")?;
    if is_bpffs() {
        return Ok(());
    }
    std::fs::create_dir_all(BPFFS_MOUNT)
        .map_err(|e| Error::io(format!("creating {BPFFS_MOUNT}"), e))?;
    use nix::mount::{MsFlags, mount};
    mount(
        Some("bpf"),
        BPFFS_MOUNT,
        Some("bpf"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0700"),
    )
    .map_err(|e| datapath_err(&format!("mounting bpffs at {BPFFS_MOUNT}"), e))
}

/// True when a bpffs is mounted where pins go: /sys/fs/bpf, or the moved
/// pin root (STATUS reports it).
pub fn bpffs_is_mounted() -> bool {
    let root = pin_root();
    if !root.starts_with(BPFFS_MOUNT) {
        return on_bpffs(&root);
    }
    nix::sys::statfs::statfs(BPFFS_MOUNT).is_ok_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
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
    dir: PathBuf,
}

impl Datapath {
    /// The network's datapath under the pin root in force (see `pin_root`).
    pub fn new(network: &str) -> Self {
        Self::with_root(&pin_root(), network)
    }

    /// The network's datapath under an explicit pin root.
    pub fn with_root(root: &Path, network: &str) -> Self {
        Datapath {
            dir: root.join(pin_name(network)),
        }
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
    pub fn pinned_programs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| !MAPS.contains(&name.as_str()))
            .collect()
    }

    /// Counter maps of an older build that this one cannot use are
    /// unpinned, so the load makes new ones: a `STATS` with fewer slots than
    /// this build counts actions, an `ENDPOINT_STATS` that is not the per-CPU
    /// array of counter slots. Counters restart from zero, nothing else is
    /// lost; programs still attached keep the old maps until their veth moves.
    fn retire_stale_counters(&self) -> Result<()> {
        for name in [MAP_STATS, MAP_ENDPOINT_STATS] {
            let Some(info) = self.pinned_map_info(name)? else {
                continue;
            };
            let path = self.map_path(name);
            let stale = match name {
                MAP_STATS => info.max_entries() < action::COUNT,
                _ => !matches!(info.map_type(), Ok(aya::maps::MapType::PerCpuArray)),
            };
            if stale {
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io(format!("unpinning {}", path.display()), e))?;
            }
        }
        Ok(())
    }

    /// Where this network's counter slots are claimed: one file per slot in
    /// use, created exclusively (so two ADDs can never take the same slot),
    /// holding the host veth's ifindex. tmpfs, like the pins' lifetime.
    fn slots_dir(&self) -> PathBuf {
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Path::new(LOCK_DIR).join(format!("slots-{name}"))
    }

    /// Claims a free counter slot for the pod behind host veth `index`; the
    /// search starts at a place derived from the ifindex, so it rarely probes.
    /// A slot whose owner's veth is gone (a crashed ADD) is taken over.
    pub fn claim_counter_slot(&self, index: u32) -> Result<u32> {
        let dir = self.slots_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let usable = MAX_ENDPOINTS - 1;
        for probe in 0..usable {
            let slot = 1 + (index.wrapping_add(probe)) % usable;
            let path = dir.join(slot.to_string());
            for _attempt in 0..2 {
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                {
                    Ok(mut file) => {
                        use std::io::Write;
                        file.write_all(index.to_string().as_bytes())
                            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                        self.zero_counters(slot)?;
                        return Ok(slot);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let owner = std::fs::read_to_string(&path)
                            .ok()
                            .and_then(|t| t.trim().parse::<u32>().ok());
                        match owner {
                            Some(owner) if owner == index => return Ok(slot),
                            Some(owner) if crate::link::ifindex_is_gone(owner) => {
                                let _ = std::fs::remove_file(&path);
                            }
                            _ => break,
                        }
                    }
                    Err(e) => return Err(Error::io(format!("claiming {}", path.display()), e)),
                }
            }
        }
        Err(Error::Datapath(format!(
            "no free counter slot: {usable} pods is this network's limit"
        )))
    }

    /// Gives a slot back (a removed pod, a failed ADD).
    pub fn release_counter_slot(&self, slot: u32) {
        if slot != NO_COUNTER_SLOT {
            let _ = std::fs::remove_file(self.slots_dir().join(slot.to_string()));
        }
    }

    /// The counter slot of an existing pod, claimed (and written into its
    /// entries) when an older build left it without one: upgrades, repairs.
    pub fn ensure_counter_slot(&self, index: u32) -> Result<u32> {
        let mut veths = self.hash_map::<u32, Endpoint>(MAP_HOST_VETHS)?;
        let mut endpoint = match veths.get(&index, 0) {
            Ok(endpoint) => endpoint,
            Err(aya::maps::MapError::KeyNotFound) => return self.claim_counter_slot(index),
            Err(e) => return Err(datapath_err("reading a host veth", e)),
        };
        if endpoint.counter_slot != NO_COUNTER_SLOT {
            return Ok(endpoint.counter_slot);
        }
        endpoint.counter_slot = self.claim_counter_slot(index)?;
        let addresses = self.addresses_of(index)?;
        self.set_sources(endpoint.counter_slot, &addresses)?;
        veths
            .insert(index, endpoint, 0)
            .map_err(|e| datapath_err("updating a host veth", e))?;
        self.update_entries::<Ipv4Key>(MAP_ENDPOINTS_V4, endpoint)?;
        self.update_entries::<Ipv6Key>(MAP_ENDPOINTS_V6, endpoint)?;
        Ok(endpoint.counter_slot)
    }

    /// Rewrites the address entries of `endpoint`'s pod with `endpoint`.
    fn update_entries<K: aya::Pod>(&self, name: &str, endpoint: Endpoint) -> Result<()> {
        let mut map = self.hash_map::<K, Endpoint>(name)?;
        let keys: Vec<K> = map
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, ep)| ep.host_ifindex == endpoint.host_ifindex)
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            map.insert(key, endpoint, 0)
                .map_err(|e| datapath_err("updating an endpoint", e))?;
        }
        Ok(())
    }

    /// The addresses the address maps give the pod behind host veth `index`.
    fn addresses_of(&self, index: u32) -> Result<Vec<IpAddr>> {
        Ok(self
            .all_endpoints()?
            .into_iter()
            .filter(|(_, endpoint)| endpoint.host_ifindex == index)
            .map(|(ip, _)| ip)
            .collect())
    }

    fn pod_sources(&self) -> Result<Array<MapData, PodSources>> {
        Array::try_from(Map::Array(self.open_map(MAP_POD_SOURCES)?))
            .map_err(|e| datapath_err(&format!("opening {MAP_POD_SOURCES}"), e))
    }

    /// Writes the addresses the pod in counter slot `slot` may send from.
    fn set_sources(&self, slot: u32, addresses: &[IpAddr]) -> Result<()> {
        if slot == NO_COUNTER_SLOT {
            return Ok(());
        }
        self.pod_sources()?
            .set(slot, sources_of(addresses), 0)
            .map_err(|e| datapath_err("writing a pod's source addresses", e))
    }

    /// The source addresses written for counter slot `slot`.
    pub fn sources(&self, slot: u32) -> Result<PodSources> {
        self.pod_sources()?
            .get(&slot, 0)
            .map_err(|e| datapath_err("reading a pod's source addresses", e))
    }

    /// Empties a freed slot's source addresses.
    fn clear_sources(&self, slot: u32) -> Result<()> {
        if slot == NO_COUNTER_SLOT || !self.map_path(MAP_POD_SOURCES).exists() {
            return Ok(());
        }
        self.pod_sources()?
            .set(slot, PodSources::default(), 0)
            .map_err(|e| datapath_err("clearing a pod's source addresses", e))
    }

    /// Fills `POD_SOURCES` for every pod whose entry is not written yet (an
    /// upgrade from a build without the map), before the new programs are
    /// attached: they drop what they find neither there nor in the address
    /// maps. One pass over the maps, however many pods.
    fn fill_missing_sources(&self) -> Result<()> {
        let veths = self.host_veths()?;
        if veths.is_empty() {
            return Ok(());
        }
        let sources = self.pod_sources()?;
        let endpoints = self.all_endpoints()?;
        for (index, endpoint) in veths {
            let slot = endpoint.counter_slot;
            if slot == NO_COUNTER_SLOT {
                continue;
            }
            let current = sources
                .get(&slot, 0)
                .map_err(|e| datapath_err("reading a pod's source addresses", e))?;
            if current.flags & SOURCES_F_VALID != 0 {
                continue;
            }
            let addresses: Vec<IpAddr> = endpoints
                .iter()
                .filter(|(_, e)| e.host_ifindex == index)
                .map(|(ip, _)| *ip)
                .collect();
            self.set_sources(slot, &addresses)?;
        }
        Ok(())
    }

    fn zero_counters(&self, slot: u32) -> Result<()> {
        let cpus = nr_cpus().map_err(|(_, e)| datapath_err("counting CPUs", e))?;
        let zeros = PerCpuValues::try_from(vec![EndpointCounters::default(); cpus])
            .map_err(|e| datapath_err("building per-CPU counters", e))?;
        self.endpoint_counters()?
            .set(slot, zeros, 0)
            .map_err(|e| datapath_err("zeroing a pod's counters", e))
    }

    /// What the kernel says of a pinned map of this network; None when
    /// it is not pinned.
    fn pinned_map_info(&self, name: &str) -> Result<Option<MapInfo>> {
        let path = self.map_path(name);
        if !path.exists() {
            return Ok(None);
        }
        let map = MapData::from_pin(&path)
            .map_err(|e| datapath_err(&format!("opening {}", path.display()), e))?;
        map.info()
            .map(Some)
            .map_err(|e| datapath_err(&format!("reading {}", path.display()), e))
    }

    /// Refuses to reuse pinned maps whose layout is not this build's: the
    /// programs would read garbage. (A layout change needs a drained node.)
    fn check_pinned_maps(&self) -> Result<()> {
        for (name, key_size, value_size) in MAP_LAYOUTS {
            let Some(info) = self.pinned_map_info(name)? else {
                continue;
            };
            let path = self.map_path(name);
            if info.key_size() != key_size || info.value_size() != value_size {
                return Err(Error::Datapath(format!(
                    "{} has key/value sizes {}/{}, this build needs {key_size}/{value_size}: delete this network's pods, then remove {}",
                    path.display(),
                    info.key_size(),
                    info.value_size(),
                    self.dir.display()
                )));
            }
        }
        Ok(())
    }

    /// Loads the object (one verifier run per program), reusing the pinned
    /// maps so their contents survive, and pins `mode`'s programs. The caller
    /// holds the network lock exclusively. Programs of older builds stay
    /// pinned until `retire_other_programs`, after the veths were moved over.
    pub fn load(&self, mode: DatapathMode) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::io(format!("creating {}", self.dir.display()), e))?;
        self.check_pinned_maps()?;
        self.retire_stale_counters()?;
        let map_pins: Vec<(&str, PathBuf)> = MAPS.iter().map(|m| (*m, self.map_path(m))).collect();
        let mut loader = EbpfLoader::new();
        for (name, path) in &map_pins {
            loader.map_pin_path(name, path.as_path());
        }
        // XDP mode routes pods' packets for other nodes through the stack:
        // the replies must not skip it (see the eBPF crate).
        let uplink_to_pods: u32 = u32::from(mode == DatapathMode::Tc);
        loader.override_global(GLOBAL_UPLINK_TO_PODS, &uplink_to_pods, true);
        // Kfunc calls aimed at this kernel's functions first.
        let object = crate::kfunc::resolve(OBJECT)?;
        let mut ebpf = loader
            .load(object.bytes())
            .map_err(|e| datapath_err("loading the eBPF object", e))?;
        for name in programs(mode) {
            let program = ebpf
                .program_mut(name)
                .ok_or_else(|| Error::Datapath(format!("the eBPF object has no program {name}")))?;
            match program {
                Program::SchedClassifier(p) => p.load(),
                Program::Xdp(p) => p.load(),
                _ => {
                    return Err(Error::Datapath(format!(
                        "{name} has an unexpected program type"
                    )));
                }
            }
            .map_err(|e| datapath_err(&format!("verifying {name}"), e))?;
            // Pin under a temporary name and rename: a concurrent reader sees
            // either no program or a complete one.
            let final_path = self.program_path(name);
            let temp_path = self
                .dir
                .join(format!("{name}-{DATAPATH_ID}-tmp{}", std::process::id()));
            program
                .pin(&temp_path)
                .map_err(|e| datapath_err(&format!("pinning {}", temp_path.display()), e))?;
            std::fs::rename(&temp_path, &final_path).map_err(|e| {
                Error::io(
                    format!("renaming the pinned program to {}", final_path.display()),
                    e,
                )
            })?;
        }
        self.fill_missing_sources()
    }

    /// Unpins every program that is not this build's `mode` set. Attached
    /// copies keep running until their veth moves to the new one.
    pub fn retire_other_programs(&self, mode: DatapathMode) -> Result<()> {
        let keep: BTreeSet<String> = programs(mode)
            .iter()
            .map(|p| format!("{p}-{DATAPATH_ID}"))
            .collect();
        for name in self.pinned_programs() {
            if !keep.contains(&name) {
                let path = self.dir.join(&name);
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io(format!("unpinning {}", path.display()), e))?;
            }
        }
        Ok(())
    }

    /// This build's pinned `program`, open.
    pub fn program(&self, name: &str) -> Result<ProgramHandle> {
        let path = self.program_path(name);
        let context = || format!("opening {}", path.display());
        let info = ProgramInfo::from_pin(&path).map_err(|e| datapath_err(&context(), e))?;
        let fd = info.fd().map_err(|e| datapath_err(&context(), e))?;
        Ok(ProgramHandle { info, fd })
    }

    fn open_map(&self, name: &str) -> Result<MapData> {
        let path = self.map_path(name);
        MapData::from_pin(&path)
            .map_err(|e| datapath_err(&format!("opening {}", path.display()), e))
    }

    fn hash_map<K: aya::Pod, V: aya::Pod>(&self, name: &str) -> Result<HashMap<MapData, K, V>> {
        HashMap::try_from(Map::HashMap(self.open_map(name)?))
            .map_err(|e| datapath_err(&format!("opening {name}"), e))
    }

    fn endpoint_counters(&self) -> Result<PerCpuArray<MapData, EndpointCounters>> {
        PerCpuArray::try_from(Map::PerCpuArray(self.open_map(MAP_ENDPOINT_STATS)?))
            .map_err(|e| datapath_err(&format!("opening {MAP_ENDPOINT_STATS}"), e))
    }

    /// Makes a pod known to the datapath: its host veth (with the counter
    /// slot claimed for it, zeroed then), then its addresses (last, so no
    /// packet is redirected to a half-known pod).
    pub fn insert_pod(&self, endpoint: Endpoint, addresses: &[IpAddr]) -> Result<()> {
        let index = endpoint.host_ifindex;
        self.set_sources(endpoint.counter_slot, addresses)?;
        self.hash_map::<u32, Endpoint>(MAP_HOST_VETHS)?
            .insert(index, endpoint, 0)
            .map_err(|e| datapath_err("inserting the host veth", e))?;
        for address in addresses {
            match address {
                IpAddr::V4(v4) => self
                    .hash_map::<Ipv4Key, Endpoint>(MAP_ENDPOINTS_V4)?
                    .insert(v4.octets(), endpoint, 0),
                IpAddr::V6(v6) => self
                    .hash_map::<Ipv6Key, Endpoint>(MAP_ENDPOINTS_V6)?
                    .insert(v6.octets(), endpoint, 0),
            }
            .map_err(|e| datapath_err(&format!("inserting endpoint {address}"), e))?;
        }
        Ok(())
    }

    /// The endpoint of an address, if the datapath knows it.
    pub fn endpoint(&self, address: IpAddr) -> Result<Option<Endpoint>> {
        let found = match address {
            IpAddr::V4(v4) => self
                .hash_map::<Ipv4Key, Endpoint>(MAP_ENDPOINTS_V4)?
                .get(&v4.octets(), 0),
            IpAddr::V6(v6) => self
                .hash_map::<Ipv6Key, Endpoint>(MAP_ENDPOINTS_V6)?
                .get(&v6.octets(), 0),
        };
        match found {
            Ok(endpoint) => Ok(Some(endpoint)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(datapath_err("reading an endpoint", e)),
        }
    }

    /// Every address the datapath knows, with its endpoint.
    pub fn all_endpoints(&self) -> Result<Vec<(IpAddr, Endpoint)>> {
        let mut all = Vec::new();
        for entry in self.hash_map::<Ipv4Key, Endpoint>(MAP_ENDPOINTS_V4)?.iter() {
            let (ip, endpoint) = entry.map_err(|e| datapath_err("listing endpoints", e))?;
            all.push((IpAddr::from(ip), endpoint));
        }
        for entry in self.hash_map::<Ipv6Key, Endpoint>(MAP_ENDPOINTS_V6)?.iter() {
            let (ip, endpoint) = entry.map_err(|e| datapath_err("listing endpoints", e))?;
            all.push((IpAddr::from(ip), endpoint));
        }
        Ok(all)
    }

    /// The host veths the datapath serves (ifindex -> endpoint).
    pub fn host_veths(&self) -> Result<Vec<(u32, Endpoint)>> {
        self.hash_map::<u32, Endpoint>(MAP_HOST_VETHS)?
            .iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| datapath_err("listing host veths", e))
    }

    /// How many pods the network has; 0 when its maps are not pinned.
    pub fn pod_count(&self) -> Result<usize> {
        if !self.map_path(MAP_HOST_VETHS).exists() {
            return Ok(0);
        }
        Ok(self.host_veths()?.len())
    }

    /// True when the network has no pod: one map lookup, not a count.
    pub fn has_no_pod(&self) -> Result<bool> {
        if !self.map_path(MAP_HOST_VETHS).exists() {
            return Ok(true);
        }
        Ok(self
            .hash_map::<u32, Endpoint>(MAP_HOST_VETHS)?
            .keys()
            .next()
            .is_none())
    }

    /// Forgets the pod behind host veth `index`. With its `addresses` known
    /// (DEL's prevResult: the result ADD returned) this costs a few lookups,
    /// however many pods the node has; without, the address maps are
    /// searched. Addresses first, so nothing is redirected to it any more.
    pub fn remove_pod(&self, index: u32, addresses: Option<&[IpAddr]>) -> Result<()> {
        match addresses {
            Some(addresses) => {
                // Each address map opened once, and only for a family the
                // pod has: this runs on every DEL.
                let (v4, v6): (Vec<Ipv4Key>, Vec<Ipv6Key>) = (
                    addresses
                        .iter()
                        .filter_map(|a| match a {
                            IpAddr::V4(v4) => Some(v4.octets()),
                            IpAddr::V6(_) => None,
                        })
                        .collect(),
                    addresses
                        .iter()
                        .filter_map(|a| match a {
                            IpAddr::V6(v6) => Some(v6.octets()),
                            IpAddr::V4(_) => None,
                        })
                        .collect(),
                );
                if !v4.is_empty() {
                    remove_if_pointing_at(&mut self.hash_map(MAP_ENDPOINTS_V4)?, &v4, index)?;
                }
                if !v6.is_empty() {
                    remove_if_pointing_at(&mut self.hash_map(MAP_ENDPOINTS_V6)?, &v6, index)?;
                }
            }
            None => self.remove_addresses_of(|i| i == index)?,
        }
        let mut veths = self.hash_map::<u32, Endpoint>(MAP_HOST_VETHS)?;
        if let Ok(endpoint) = veths.get(&index, 0) {
            self.clear_sources(endpoint.counter_slot)?;
            self.release_counter_slot(endpoint.counter_slot);
        }
        ignore_missing(veths.remove(&index))
    }

    /// Removes the addresses whose host veth `doomed` selects.
    fn remove_addresses_of(&self, doomed: impl Fn(u32) -> bool) -> Result<()> {
        self.remove_entries::<Ipv4Key>(MAP_ENDPOINTS_V4, &doomed)?;
        self.remove_entries::<Ipv6Key>(MAP_ENDPOINTS_V6, &doomed)
    }

    /// Removes the entries of address map `name` whose host veth `doomed` selects.
    fn remove_entries<K: aya::Pod>(&self, name: &str, doomed: &impl Fn(u32) -> bool) -> Result<()> {
        let mut map = self.hash_map::<K, Endpoint>(name)?;
        let keys: Vec<K> = map
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, ep)| doomed(ep.host_ifindex))
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            ignore_missing(map.remove(&key))?;
        }
        Ok(())
    }

    /// Forgets every pod whose host veth `doomed` selects (by ifindex):
    /// addresses first, so nothing is redirected to it any more.
    pub fn remove_pods(&self, doomed: impl Fn(u32) -> bool) -> Result<()> {
        self.remove_addresses_of(&doomed)?;
        let mut veths = self.hash_map::<u32, Endpoint>(MAP_HOST_VETHS)?;
        let pods: Vec<(u32, Endpoint)> = veths
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(index, _)| doomed(*index))
            .collect();
        for (index, endpoint) in pods {
            ignore_missing(veths.remove(&index))?;
            self.clear_sources(endpoint.counter_slot)?;
            self.release_counter_slot(endpoint.counter_slot);
        }
        Ok(())
    }

    /// The action counters summed over all CPUs, indexed by `action`.
    pub fn stats(&self) -> Result<[Counter; action::COUNT as usize]> {
        let map: PerCpuArray<MapData, Counter> =
            PerCpuArray::try_from(Map::PerCpuArray(self.open_map(MAP_STATS)?))
                .map_err(|e| datapath_err(&format!("opening {MAP_STATS}"), e))?;
        let mut totals = [Counter::default(); action::COUNT as usize];
        for (index, total) in totals.iter_mut().enumerate() {
            let per_cpu = map
                .get(&(index as u32), 0)
                .map_err(|e| datapath_err("reading counters", e))?;
            for counter in per_cpu.iter() {
                total.packets += counter.packets;
                total.bytes += counter.bytes;
            }
        }
        Ok(totals)
    }

    /// The traffic counted in one counter slot, summed over all CPUs (all
    /// zero for `NO_COUNTER_SLOT`). A pod's slot is in its `Endpoint`; a
    /// freed slot keeps its counts until an ADD claims and zeroes it.
    pub fn slot_counters(&self, slot: u32) -> Result<EndpointCounters> {
        if slot == NO_COUNTER_SLOT {
            return Ok(EndpointCounters::default());
        }
        let per_cpu = self
            .endpoint_counters()?
            .get(&slot, 0)
            .map_err(|e| datapath_err("reading endpoint counters", e))?;
        Ok(per_cpu
            .iter()
            .fold(EndpointCounters::default(), |sum, c| EndpointCounters {
                tx_packets: sum.tx_packets + c.tx_packets,
                tx_bytes: sum.tx_bytes + c.tx_bytes,
                rx_packets: sum.rx_packets + c.rx_packets,
                rx_bytes: sum.rx_bytes + c.rx_bytes,
            }))
    }

    fn remote_v4(&self) -> Result<LpmTrie<MapData, RemoteCidrV4, RemoteNode>> {
        LpmTrie::try_from(Map::LpmTrie(self.open_map(MAP_REMOTE_CIDRS_V4)?))
            .map_err(|e| datapath_err(&format!("opening {MAP_REMOTE_CIDRS_V4}"), e))
    }

    fn remote_v6(&self) -> Result<LpmTrie<MapData, RemoteCidrV6, RemoteNode>> {
        LpmTrie::try_from(Map::LpmTrie(self.open_map(MAP_REMOTE_CIDRS_V6)?))
            .map_err(|e| datapath_err(&format!("opening {MAP_REMOTE_CIDRS_V6}"), e))
    }

    /// Other nodes' pod CIDRs the fast path knows, with the node's address.
    pub fn remote_cidrs(&self) -> Result<Vec<(IpNetwork, IpAddr)>> {
        let mut found = Vec::new();
        for entry in self.remote_v4()?.iter() {
            let (key, node) = entry.map_err(|e| datapath_err("listing remote CIDRs", e))?;
            found.push((
                remote_network(key.prefix_len(), &key.data())?,
                node_address(&node),
            ));
        }
        for entry in self.remote_v6()?.iter() {
            let (key, node) = entry.map_err(|e| datapath_err("listing remote CIDRs", e))?;
            found.push((
                remote_network(key.prefix_len(), &key.data())?,
                node_address(&node),
            ));
        }
        Ok(found)
    }

    /// Makes the remote-CIDR tries hold exactly `wanted` (CIDR -> node
    /// address): new and changed entries first, then the ones no longer
    /// wanted, so a CIDR that stays never misses a packet. Entries already
    /// right are not written again (the agent calls this at every pass).
    pub fn set_remote_cidrs(&self, wanted: &[(IpNetwork, IpAddr)]) -> Result<()> {
        let current: std::collections::HashMap<IpNetwork, IpAddr> =
            self.remote_cidrs()?.into_iter().collect();
        let wanted: std::collections::HashMap<IpNetwork, IpAddr> = wanted
            .iter()
            .map(|(cidr, node)| (crate::util::normalized(*cidr), *node))
            .collect();
        let mut v4 = self.remote_v4()?;
        let mut v6 = self.remote_v6()?;
        for (cidr, node) in &wanted {
            if current.get(cidr) == Some(node) {
                continue;
            }
            let value = remote_node(*node);
            match cidr {
                IpNetwork::V4(net) => v4.insert(&remote_key_v4(net), value, 0),
                IpNetwork::V6(net) => v6.insert(&remote_key_v6(net), value, 0),
            }
            .map_err(|e| datapath_err(&format!("inserting remote CIDR {cidr}"), e))?;
        }
        for cidr in current.keys().filter(|cidr| !wanted.contains_key(cidr)) {
            ignore_missing(match cidr {
                IpNetwork::V4(net) => v4.remove(&remote_key_v4(net)),
                IpNetwork::V6(net) => v6.remove(&remote_key_v6(net)),
            })?;
        }
        Ok(())
    }

    /// Unpins everything of this network. Attached programs keep their own
    /// references, so this never breaks a veth that still exists.
    pub fn remove_pins(&self) -> Result<()> {
        let _ = std::fs::remove_dir_all(self.slots_dir());
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", self.dir.display()), e)),
        }
    }
}

/// The `POD_SOURCES` entry of a pod with `addresses`: up to
/// `SOURCES_PER_FAMILY` per family, `SOURCES_F_MORE` when it has more.
pub fn sources_of(addresses: &[IpAddr]) -> PodSources {
    let mut sources = PodSources {
        flags: SOURCES_F_VALID,
        ..PodSources::default()
    };
    let (mut v4, mut v6) = (0, 0);
    for address in addresses {
        match address {
            IpAddr::V4(ip) if v4 < SOURCES_PER_FAMILY => {
                sources.v4[v4] = ip.octets();
                v4 += 1;
            }
            IpAddr::V6(ip) if v6 < SOURCES_PER_FAMILY => {
                sources.v6[v6] = ip.octets();
                v6 += 1;
            }
            _ => sources.flags |= SOURCES_F_MORE,
        }
    }
    sources
}

/// The CIDR an LPM key stands for.
fn remote_network(prefix_len: u32, data: &[u8]) -> Result<IpNetwork> {
    let ip = match data.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(data).unwrap_or_default()),
        _ => IpAddr::from(<[u8; 16]>::try_from(data).unwrap_or_default()),
    };
    let prefix = u8::try_from(prefix_len).unwrap_or(u8::MAX);
    IpNetwork::new(ip, prefix)
        .map_err(|e| Error::Datapath(format!("a remote CIDR key is malformed: {e}")))
}

fn remote_key_v4(net: &ipnetwork::Ipv4Network) -> LpmKey<RemoteCidrV4> {
    LpmKey::new(u32::from(net.prefix()), net.network().octets())
}

fn remote_key_v6(net: &ipnetwork::Ipv6Network) -> LpmKey<RemoteCidrV6> {
    LpmKey::new(u32::from(net.prefix()), net.network().octets())
}

fn remote_node(address: IpAddr) -> RemoteNode {
    let mut value = RemoteNode::default();
    match address {
        IpAddr::V4(v4) => {
            value.node_address[..4].copy_from_slice(&v4.octets());
            value.family = FAMILY_INET;
        }
        IpAddr::V6(v6) => {
            value.node_address = v6.octets();
            value.family = FAMILY_INET6;
        }
    }
    value
}

fn node_address(node: &RemoteNode) -> IpAddr {
    if node.family == FAMILY_INET6 {
        IpAddr::from(node.node_address)
    } else {
        let mut v4 = [0u8; 4];
        v4.copy_from_slice(&node.node_address[..4]);
        IpAddr::from(v4)
    }
}

/// Removes each of `keys` whose endpoint is the pod behind host veth
/// `index` (an address already handed to another pod stays).
fn remove_if_pointing_at<K: aya::Pod>(
    map: &mut HashMap<MapData, K, Endpoint>,
    keys: &[K],
    index: u32,
) -> Result<()> {
    for key in keys {
        match map.get(key, 0) {
            Ok(endpoint) if endpoint.host_ifindex == index => ignore_missing(map.remove(key))?,
            Ok(_) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(datapath_err("reading an endpoint", e)),
        }
    }
    Ok(())
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
        Err(e) => Err(datapath_err("removing a map entry", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_an_ebpf_elf_with_btf() {
        assert_eq!(&OBJECT[..4], b"\x7fELF");
        // e_machine EM_BPF = 247, little endian.
        assert_eq!(u16::from_le_bytes([OBJECT[18], OBJECT[19]]), 247);
        let needle = b".BTF";
        assert!(OBJECT.windows(needle.len()).any(|w| w == needle));
        assert_eq!(DATAPATH_ID.len(), 12);
        for program in [
            PROG_FROM_POD,
            PROG_FROM_POD_XDP,
            PROG_POD_XDP_PASS,
            PROG_FROM_UPLINK,
        ] {
            assert!(
                OBJECT
                    .windows(program.len())
                    .any(|w| w == program.as_bytes()),
                "{program}"
            );
        }
    }

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
            [PROG_FROM_POD, PROG_FROM_UPLINK]
        );
        assert_eq!(
            programs(DatapathMode::Xdp),
            [PROG_FROM_POD_XDP, PROG_POD_XDP_PASS, PROG_FROM_UPLINK]
        );
    }

    #[test]
    fn an_explicit_root_moves_the_pins() {
        let dp = Datapath::with_root(Path::new("/tmp/bpf/node1"), "a.b");
        assert_eq!(dp.pin_dir(), Path::new("/tmp/bpf/node1/a~b"));
    }

    #[test]
    fn sources_hold_a_pods_addresses_and_say_when_there_are_more() {
        let ips: Vec<IpAddr> = ["10.1.0.5", "fd00::5", "10.2.0.5"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let sources = sources_of(&ips);
        assert_eq!(sources.flags, SOURCES_F_VALID);
        assert_eq!(sources.v4[..2], [[10, 1, 0, 5], [10, 2, 0, 5]]);
        assert_eq!(sources.v4[2], [0; 4]);
        assert_eq!(
            sources.v6[0],
            "fd00::5".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        let many: Vec<IpAddr> = (1..=5).map(|i| IpAddr::from([10, 0, 0, i])).collect();
        let sources = sources_of(&many);
        assert_eq!(sources.flags, SOURCES_F_VALID | SOURCES_F_MORE);
        assert_eq!(sources.v4[3], [10, 0, 0, 4]);
        assert_eq!(sources_of(&[]).flags, SOURCES_F_VALID);
    }

    #[test]
    fn remote_keys_and_values_round_trip() {
        let net: IpNetwork = "10.244.3.0/24".parse().unwrap();
        assert_eq!(remote_network(24, &[10, 244, 3, 0]).unwrap(), net);
        let v6: IpNetwork = "fd00:10::/64".parse().unwrap();
        let IpNetwork::V6(inner) = v6 else {
            unreachable!()
        };
        assert_eq!(remote_network(64, &inner.network().octets()).unwrap(), v6);
        assert!(remote_network(33, &[10, 0, 0, 0]).is_err());
        for address in ["172.31.0.2", "fd00::2"] {
            let ip: IpAddr = address.parse().unwrap();
            assert_eq!(node_address(&remote_node(ip)), ip);
        }
        assert_eq!(
            crate::util::normalized("10.1.2.3/16".parse().unwrap()),
            "10.1.0.0/16".parse::<IpNetwork>().unwrap()
        );
    }
}

//! The eBPF datapath of one network: the object embedded in this binary, its
//! programs and maps pinned under /sys/fs/bpf/flatnet/<network>/, tc
//! attachment on host veths, and the endpoint and counter maps.

use std::path::{Path, PathBuf};

use aya::maps::{HashMap, Map, MapData, PerCpuArray};
use aya::programs::tc::{self, NlOptions, SchedClassifier, TcAttachOptions, TcError, TcHandle};
use aya::programs::{ProgramError, TcAttachType};
use aya::{EbpfLoader, include_bytes_aligned};
use flatnet_common::{
    Counter, Endpoint, Ipv4Key, MAP_ENDPOINTS_V4, MAP_STATS, PIN_ROOT, PROG_FROM_POD, action,
};

use crate::cni::error::{Error, Result};
use crate::lock::Lock;

/// The datapath object, built by build.rs for bpfel-unknown-none with BTF.
static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flatnet-ebpf"));

/// A short hash of `OBJECT`: pinned programs carry it in their name.
pub const DATAPATH_ID: &str = env!("FLATNET_DATAPATH_ID");

/// tc filter priority and handle of `from_pod` on every host veth: fixed, so
/// CHECK can find it and an upgrade can replace it in place.
const TC_PRIORITY: u16 = 1;
const TC_HANDLE: TcHandle = TcHandle::new(0, 1);

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS_MOUNT: &str = "/sys/fs/bpf";

fn datapath_err(context: &str, err: impl std::error::Error) -> Error {
    Error::Datapath(format!("{context}: {}", crate::cni::error::chain(&err)))
}

/// Mounts bpffs at /sys/fs/bpf unless it already is, as production CNIs do:
/// without it nothing can be pinned and every ADD would reload the programs.
pub fn ensure_bpffs() -> Result<()> {
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

/// bpffs refuses '.' in names (reserved for the kernel); network names may
/// contain it. '~' cannot appear in a network name, so the mapping is one-to-one.
pub fn pin_name(network: &str) -> String {
    network.replace('.', "~")
}

/// One network's pinned datapath.
pub struct Datapath {
    dir: PathBuf,
}

impl Datapath {
    pub fn new(network: &str) -> Self {
        Datapath {
            dir: Path::new(PIN_ROOT).join(pin_name(network)),
        }
    }

    pub fn pin_dir(&self) -> &Path {
        &self.dir
    }

    /// The pinned `from_pod` of this build.
    pub fn program_path(&self) -> PathBuf {
        self.dir.join(format!("{PROG_FROM_POD}-{DATAPATH_ID}"))
    }

    pub fn map_path(&self, map: &str) -> PathBuf {
        self.dir.join(map)
    }

    /// True when this build's program is pinned (maps are pinned before it).
    pub fn is_loaded(&self) -> bool {
        self.program_path().exists()
    }

    /// True when anything of this network is pinned at all.
    pub fn exists(&self) -> bool {
        self.dir.exists()
    }

    /// Loads the object, reusing pinned maps (their contents survive), and
    /// pins `from_pod`. The caller holds the network lock exclusively.
    pub fn load(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::io(format!("creating {}", self.dir.display()), e))?;
        let endpoints_pin = self.map_path(MAP_ENDPOINTS_V4);
        let stats_pin = self.map_path(MAP_STATS);
        let mut ebpf = EbpfLoader::new()
            .map_pin_path(MAP_ENDPOINTS_V4, endpoints_pin.as_path())
            .map_pin_path(MAP_STATS, stats_pin.as_path())
            .load(OBJECT)
            .map_err(|e| datapath_err("loading the eBPF object", e))?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(PROG_FROM_POD)
            .ok_or_else(|| {
                Error::Datapath(format!("the eBPF object has no program {PROG_FROM_POD}"))
            })?
            .try_into()
            .map_err(|e: ProgramError| datapath_err("loading the eBPF object", e))?;
        program
            .load()
            .map_err(|e| datapath_err(&format!("verifying {PROG_FROM_POD}"), e))?;
        // Pin under a temporary name and rename: a concurrent reader sees
        // either no program or a complete one.
        let final_path = self.program_path();
        let temp_path = self.dir.join(format!(
            "{PROG_FROM_POD}-{DATAPATH_ID}-tmp{}",
            std::process::id()
        ));
        program
            .pin(&temp_path)
            .map_err(|e| datapath_err(&format!("pinning {}", temp_path.display()), e))?;
        std::fs::rename(&temp_path, &final_path).map_err(|e| {
            Error::io(
                format!("renaming the pinned program to {}", final_path.display()),
                e,
            )
        })?;
        Ok(())
    }

    fn pinned_program(&self) -> Result<SchedClassifier> {
        SchedClassifier::from_pin(self.program_path())
            .map_err(|e| datapath_err(&format!("opening {}", self.program_path().display()), e))
    }

    /// The kernel ID of this build's pinned `from_pod`.
    pub fn program_id(&self) -> Result<u32> {
        let program = self.pinned_program()?;
        let info = program
            .info()
            .map_err(|e| datapath_err("reading program info", e))?;
        Ok(info.id())
    }

    /// Attaches the pinned `from_pod` to `ifname`'s tc ingress. The filter
    /// stays after this process exits; deleting the veth removes it.
    pub fn attach(&self, ifname: &str) -> Result<()> {
        match tc::qdisc_add_clsact(ifname) {
            Ok(()) => {}
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(datapath_err(&format!("adding clsact qdisc to {ifname}"), e)),
        }
        let mut program = self.pinned_program()?;
        let options = TcAttachOptions::Netlink(NlOptions {
            priority: TC_PRIORITY,
            handle: TC_HANDLE,
            classid: None,
        });
        let link_id = program
            .attach_with_options(ifname, TcAttachType::Ingress, options)
            .map_err(|e| datapath_err(&format!("attaching {PROG_FROM_POD} to {ifname}"), e))?;
        let link = program
            .take_link(link_id)
            .map_err(|e| datapath_err(&format!("attaching {PROG_FROM_POD} to {ifname}"), e))?;
        // Dropping the link would detach it; the filter must outlive us.
        std::mem::forget(link);
        Ok(())
    }

    fn endpoints(&self) -> Result<HashMap<MapData, Ipv4Key, Endpoint>> {
        let path = self.map_path(MAP_ENDPOINTS_V4);
        let data = MapData::from_pin(&path)
            .map_err(|e| datapath_err(&format!("opening {}", path.display()), e))?;
        HashMap::try_from(Map::HashMap(data))
            .map_err(|e| datapath_err(&format!("opening {}", path.display()), e))
    }

    pub fn insert_endpoint(&self, ip: Ipv4Key, endpoint: Endpoint) -> Result<()> {
        self.endpoints()?.insert(ip, endpoint, 0).map_err(|e| {
            datapath_err(
                &format!("inserting endpoint {}", std::net::Ipv4Addr::from(ip)),
                e,
            )
        })
    }

    pub fn endpoint(&self, ip: Ipv4Key) -> Result<Option<Endpoint>> {
        match self.endpoints()?.get(&ip, 0) {
            Ok(endpoint) => Ok(Some(endpoint)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(datapath_err("reading an endpoint", e)),
        }
    }

    pub fn all_endpoints(&self) -> Result<Vec<(Ipv4Key, Endpoint)>> {
        self.endpoints()?
            .iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| datapath_err("listing endpoints", e))
    }

    /// How many endpoints the network has; 0 when its map is not pinned.
    pub fn endpoint_count(&self) -> Result<usize> {
        if !self.map_path(MAP_ENDPOINTS_V4).exists() {
            return Ok(0);
        }
        Ok(self.all_endpoints()?.len())
    }

    /// Removes every endpoint `doomed` selects; returns how many are left.
    pub fn remove_endpoints(&self, doomed: impl Fn(&Ipv4Key, &Endpoint) -> bool) -> Result<usize> {
        let mut map = self.endpoints()?;
        let entries: Vec<_> = map
            .iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| datapath_err("listing endpoints", e))?;
        let mut left = entries.len();
        for (ip, endpoint) in entries.iter().filter(|(ip, ep)| doomed(ip, ep)) {
            match map.remove(ip) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => left -= 1,
                Err(e) => {
                    return Err(datapath_err(
                        &format!("removing endpoint {:?}", endpoint),
                        e,
                    ));
                }
            }
        }
        Ok(left)
    }

    /// The action counters summed over all CPUs, indexed by `action`.
    pub fn stats(&self) -> Result<[Counter; action::COUNT as usize]> {
        let path = self.map_path(MAP_STATS);
        let data = MapData::from_pin(&path)
            .map_err(|e| datapath_err(&format!("opening {}", path.display()), e))?;
        let map: PerCpuArray<MapData, Counter> = PerCpuArray::try_from(Map::PerCpuArray(data))
            .map_err(|e| datapath_err(&format!("opening {}", path.display()), e))?;
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

    /// Unpins everything of this network. Attached filters keep their own
    /// references, so this never breaks a veth that still exists.
    pub fn remove_pins(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", self.dir.display()), e)),
        }
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
    }

    #[test]
    fn pins_live_under_the_network_directory() {
        let dp = Datapath::new("pods");
        assert_eq!(dp.pin_dir(), Path::new("/sys/fs/bpf/flatnet/pods"));
        assert_eq!(
            dp.program_path(),
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
}

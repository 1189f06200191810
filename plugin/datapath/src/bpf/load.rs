//! Loading and pinning the object: its kfunc calls aimed at this kernel
//! first, the programs of a mode pinned, the pinned maps reused after
//! checking them against `flatnet_common::MAP_SPECS`, and older builds
//! retired.

use std::collections::BTreeSet;

use aya::maps::{MapData, MapInfo, MapType};
use aya::programs::{Program, ProgramInfo};
use aya::{Ebpf, EbpfLoader};
use flatnet_common::{
    GLOBAL_UPLINK_TO_PODS, MAP_ENDPOINT_STATS, MAP_NODEPORT_CALLS, MAP_SPECS, MAP_STATS, MAPS,
    MapKind, MapSpec, action,
};

use super::attach::{AttachMode, attach_mode};
use super::{DATAPATH_ID, Datapath, OBJECT, ProgramHandle, programs};
use crate::DatapathMode;
use crate::error::{Error, Result};

impl Datapath {
    /// Counter maps of an older build that this one cannot use are
    /// unpinned, so the load makes new ones: a `STATS` with fewer slots than
    /// this build counts actions, an `ENDPOINT_STATS` that is not the per-CPU
    /// array of counter slots. Counters restart from zero, nothing else is
    /// lost; programs still attached keep the old maps until their veth moves.
    pub(super) fn retire_stale_counters(&self) -> Result<()> {
        // Maps this build no longer has (`RETIRED_MAPS`) go the same way.
        for name in flatnet_common::RETIRED_MAPS {
            let path = self.map_path(name);
            if path.exists() {
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io(format!("unpinning {}", path.display()), e))?;
            }
        }
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

    /// What the kernel says of a pinned map of this network; None when
    /// it is not pinned.
    pub(super) fn pinned_map_info(&self, name: &str) -> Result<Option<MapInfo>> {
        let path = self.map_path(name);
        if !path.exists() {
            return Ok(None);
        }
        let map = MapData::from_pin(&path)
            .map_err(|e| Error::bpf(format!("opening {}", path.display()), e))?;
        map.info()
            .map(Some)
            .map_err(|e| Error::bpf(format!("reading {}", path.display()), e))
    }

    /// Refuses to reuse pinned maps whose layout is not this build's (keys,
    /// values, kind, size: `flatnet_common::MAP_SPECS`): the programs would
    /// read garbage. (A layout change needs a drained node; counter maps of
    /// an older build were retired just before.)
    pub(super) fn check_pinned_maps(&self) -> Result<()> {
        for spec in MAP_SPECS {
            let Some(info) = self.pinned_map_info(spec.name)? else {
                continue;
            };
            if let Some(problem) = layout_problem(&spec, &info) {
                return Err(Error::Datapath(format!(
                    "{} {problem}: delete this network's pods, then remove {}",
                    self.map_path(spec.name).display(),
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
        // Counter maps an older build sized differently (a `STATS` with
        // fewer actions) are retired before the layout check refuses them.
        self.retire_stale_counters()?;
        self.check_pinned_maps()?;
        let mut ebpf = self.load_object(mode, &flatnet_common::cost_variant::FULL)?;
        for name in programs(mode) {
            let program = ebpf
                .program_mut(name)
                .ok_or_else(|| Error::Datapath(format!("the eBPF object has no program {name}")))?;
            match program {
                Program::SchedClassifier(p) => verify(|| p.load()),
                Program::Xdp(p) => verify(|| p.load()),
                _ => {
                    return Err(Error::Datapath(format!(
                        "{name} has an unexpected program type"
                    )));
                }
            }
            .map_err(|e| Error::bpf(format!("verifying {name}"), e))?;
            // Pin under a temporary name and rename: a concurrent reader sees
            // either no program or a complete one.
            let final_path = self.program_path(name);
            let temp_path = self
                .dir
                .join(format!("{name}-{DATAPATH_ID}-tmp{}", std::process::id()));
            program
                .pin(&temp_path)
                .map_err(|e| Error::bpf(format!("pinning {}", temp_path.display()), e))?;
            std::fs::rename(&temp_path, &final_path).map_err(|e| {
                Error::io(
                    format!("renaming the pinned program to {}", final_path.display()),
                    e,
                )
            })?;
        }
        for (index, program) in (0..).zip(flatnet_common::nodeport_call::PROGRAMS) {
            set_tail_call(&mut ebpf, MAP_NODEPORT_CALLS, index, program)?;
        }
        self.fill_missing_sources()
    }

    /// The object loaded into the kernel (its programs not yet verified),
    /// on this network's pinned maps, with the load-time settings of `mode`
    /// and this kernel: what `load` pins, or a measurement's `variant`.
    pub(super) fn load_object(&self, mode: DatapathMode, variant: &'static u32) -> Result<Ebpf> {
        let mut loader = EbpfLoader::new();
        for name in MAPS {
            loader.map_pin_path(name, self.map_path(name));
        }
        // Maps made now take the node's sizes; pinned ones keep theirs.
        let memory = super::sizes::node_memory()
            .map_err(|e| crate::error::Error::io("reading MemTotal of /proc/meminfo", e))?;
        for (name, entries) in self.sizing.sizes(memory) {
            loader.map_max_entries(name, entries);
        }
        // XDP mode routes pods' packets for other nodes through the stack:
        // the replies must not skip it (see the eBPF crate).
        let uplink_to_pods: &'static u32 = if mode == DatapathMode::Tc { &1 } else { &0 };
        loader.override_global(GLOBAL_UPLINK_TO_PODS, uplink_to_pods, true);
        // UDP answers are kept only where tcx puts `to_pod` and `to_uplink`
        // on every way out of the stack (see the eBPF crate's flow.rs).
        let udp_flows: &'static u32 = if attach_mode() == AttachMode::Tcx {
            &1
        } else {
            &0
        };
        loader.override_global(flatnet_common::GLOBAL_UDP_FLOWS, udp_flows, true);
        loader.override_global(flatnet_common::GLOBAL_COST_VARIANT, variant, true);
        // Kfunc calls aimed at this kernel's functions first.
        let object = super::kfunc::resolve(OBJECT)?;
        loader
            .load(object.bytes())
            .map_err(|e| Error::bpf("loading the eBPF object", e))
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
        let info = ProgramInfo::from_pin(&path).map_err(|e| Error::bpf(context(), e))?;
        let fd = info.fd().map_err(|e| Error::bpf(context(), e))?;
        Ok(ProgramHandle { info, fd })
    }
}

/// Points entry `index` of program array `map` at loaded program
/// `program` (the pinned array keeps it; the entry of an older build's is
/// replaced, and its programs tail-call this one from then on).
fn set_tail_call(ebpf: &mut Ebpf, map: &str, index: u32, program: &str) -> Result<()> {
    let fd = ebpf
        .program(program)
        .ok_or_else(|| Error::Datapath(format!("the eBPF object has no program {program}")))?
        .fd()
        .map_err(|e| Error::bpf(format!("the fd of {program}"), e))?
        .try_clone()
        .map_err(|e| Error::io(format!("duplicating the fd of {program}"), e))?;
    let mut calls = aya::maps::ProgramArray::try_from(
        ebpf.map_mut(map)
            .ok_or_else(|| Error::Datapath(format!("the eBPF object has no map {map}")))?,
    )
    .map_err(|e| Error::bpf(format!("opening {map}"), e))?;
    calls
        .set(index, &fd, 0)
        .map_err(|e| Error::bpf(format!("writing {map}"), e))
}

/// What is wrong with a pinned map, measured against `spec`; None when it
/// is fit for this build's programs.
fn layout_problem(spec: &MapSpec, info: &MapInfo) -> Option<String> {
    if info.key_size() != spec.key_size || info.value_size() != spec.value_size {
        return Some(format!(
            "has key/value sizes {}/{}, this build needs {}/{}",
            info.key_size(),
            info.value_size(),
            spec.key_size,
            spec.value_size
        ));
    }
    let kind = match info.map_type() {
        Ok(MapType::Hash) => Some(MapKind::Hash),
        Ok(MapType::LruHash) => Some(MapKind::LruHash),
        Ok(MapType::Array) => Some(MapKind::Array),
        Ok(MapType::PerCpuArray) => Some(MapKind::PerCpuArray),
        Ok(MapType::LpmTrie) => Some(MapKind::LpmTrie),
        Ok(MapType::RingBuf) => Some(MapKind::RingBuf),
        Ok(MapType::ProgramArray) => Some(MapKind::ProgArray),
        _ => None,
    };
    if kind != Some(spec.kind) {
        return Some(format!(
            "is a {:?} map, this build needs {:?}",
            info.map_type(),
            spec.kind
        ));
    }
    // A map sized per node keeps the size it was made with.
    let sized = super::sizes::SIZED_MAPS.contains(&spec.name);
    if !sized && info.max_entries() != spec.max_entries {
        return Some(format!(
            "holds {} entries, this build needs {}",
            info.max_entries(),
            spec.max_entries
        ));
    }
    None
}

/// Runs one program's load, again when the verifier gave up because a
/// signal reached the loading thread (EAGAIN; libbpf retries the same way):
/// a busy process's SIGCHLD must not fail an ADD. At most five tries.
pub(crate) fn verify(
    mut load: impl FnMut() -> std::result::Result<(), aya::programs::ProgramError>,
) -> std::result::Result<(), aya::programs::ProgramError> {
    let mut tries = 1;
    loop {
        match load() {
            Err(aya::programs::ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && tries < 5 =>
            {
                tries += 1;
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use flatnet_common::{
        PROG_FROM_POD, PROG_FROM_POD_PASSED, PROG_FROM_POD_XDP, PROG_FROM_UPLINK,
        PROG_POD_XDP_PASS, PROG_TO_POD, PROG_TO_UPLINK,
    };

    use super::super::object;
    use super::*;

    /// The object's maps are the spec table's, each as the spec says (the
    /// eBPF side asserts its types at compile time; this checks names,
    /// kinds and sizes as they end up in the ELF).
    #[test]
    fn the_objects_maps_are_the_spec_tables() {
        let object = aya_obj::Object::parse(object()).expect("the eBPF object parses");
        for spec in MAP_SPECS {
            let map = object
                .maps
                .get(spec.name)
                .unwrap_or_else(|| panic!("no map {} in the object", spec.name));
            assert_eq!(map.key_size(), spec.key_size, "{}", spec.name);
            assert_eq!(map.value_size(), spec.value_size, "{}", spec.name);
            assert_eq!(map.max_entries(), spec.max_entries, "{}", spec.name);
            assert_eq!(map.map_flags(), spec.flags, "{}", spec.name);
            use aya_obj::generated::bpf_map_type::*;
            let kind = match map.map_type() {
                t if t == BPF_MAP_TYPE_HASH as u32 => MapKind::Hash,
                t if t == BPF_MAP_TYPE_LRU_HASH as u32 => MapKind::LruHash,
                t if t == BPF_MAP_TYPE_ARRAY as u32 => MapKind::Array,
                t if t == BPF_MAP_TYPE_PERCPU_ARRAY as u32 => MapKind::PerCpuArray,
                t if t == BPF_MAP_TYPE_LPM_TRIE as u32 => MapKind::LpmTrie,
                t if t == BPF_MAP_TYPE_RINGBUF as u32 => MapKind::RingBuf,
                t if t == BPF_MAP_TYPE_PROG_ARRAY as u32 => MapKind::ProgArray,
                other => panic!("{}: unexpected map type {other}", spec.name),
            };
            assert_eq!(kind, spec.kind, "{}", spec.name);
        }
    }

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
            PROG_FROM_POD_PASSED,
            PROG_POD_XDP_PASS,
            PROG_FROM_UPLINK,
            PROG_TO_POD,
            PROG_TO_UPLINK,
        ] {
            assert!(
                OBJECT
                    .windows(program.len())
                    .any(|w| w == program.as_bytes()),
                "{program}"
            );
        }
    }
}

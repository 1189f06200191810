//! The datapath's kernel-function calls, resolved against the running
//! kernel before its object is loaded.
//!
//! The eBPF programs call `bpf_skb_ct_lookup`, `bpf_xdp_ct_lookup` and
//! `bpf_ct_release` (the conntrack kfuncs) through raw call instructions
//! that carry a placeholder (`flatnet_common::kfunc`) where the kernel wants
//! the function's BTF id. libbpf resolves such calls from the object's
//! `.ksyms`; aya 0.14 cannot, so this module does the same job: it reads the
//! ids from the kernel's own BTF and writes them into a copy of the object.

use aya::Btf;
use aya_obj::btf::BtfKind;
use flatnet_common::kfunc::{CALL_PREFIX, PLACEHOLDERS};
use object::{Object, ObjectSection, SectionFlags, elf::SHF_EXECINSTR};

use crate::error::{Error, Result};

/// BPF instructions are 8 bytes.
const INSN_LEN: usize = 8;

/// An ELF object in memory, aligned as the ELF parser needs (8 bytes).
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    fn copy_of(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        let mut object = AlignedObject {
            words: Vec::new(),
            len: bytes.len(),
        };
        // SAFETY: a u64 buffer viewed as at least `bytes.len()` bytes.
        let view =
            unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), bytes.len()) };
        view.copy_from_slice(bytes);
        object.words = words;
        object
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// Where in `object` each kfunc call is: (byte offset of the instruction,
/// index into `PLACEHOLDERS`), found in the executable sections only.
pub fn call_sites(object: &[u8]) -> Result<Vec<(usize, usize)>> {
    let file = object::File::parse(object)
        .map_err(|e| Error::Datapath(format!("parsing the eBPF object: {e}")))?;
    let mut sites = Vec::new();
    for section in file.sections() {
        let executable = matches!(section.flags(),
            SectionFlags::Elf { sh_flags } if sh_flags & u64::from(SHF_EXECINSTR) != 0);
        let Some((offset, size)) = section.file_range().filter(|_| executable) else {
            continue;
        };
        let (offset, size) = (offset as usize, size as usize);
        let code = object
            .get(offset..offset + size)
            .ok_or_else(|| Error::Datapath("the eBPF object has a section past its end".into()))?;
        for (index, insn) in code.chunks_exact(INSN_LEN).enumerate() {
            if insn[..4] != CALL_PREFIX {
                continue;
            }
            let imm = u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if let Some(which) = PLACEHOLDERS.iter().position(|(p, _)| *p == imm) {
                sites.push((offset + index * INSN_LEN, which));
            }
        }
    }
    Ok(sites)
}

/// The BTF id of each kernel function in `PLACEHOLDERS`, from `btf`.
fn kernel_ids(btf: &Btf) -> Result<Vec<u32>> {
    PLACEHOLDERS
        .iter()
        .map(|(_, name)| {
            btf.id_by_type_name_kind(name, BtfKind::Func).map_err(|_| {
                Error::Datapath(format!(
                    "the running kernel has no {name} kfunc: flatnet needs Linux 5.18 or later built with CONFIG_NF_CONNTRACK=y (not a module) and CONFIG_DEBUG_INFO_BTF, so that its fast path can see which flows the host's netfilter translated"
                ))
            })
        })
        .collect()
}

/// `object` with every kfunc call aimed at the running kernel's functions.
pub fn resolve(object: &[u8]) -> Result<AlignedObject> {
    let btf = Btf::from_sys_fs().map_err(|e| {
        Error::Datapath(format!(
            "reading the kernel's BTF (/sys/kernel/btf/vmlinux): {e}"
        ))
    })?;
    let ids = kernel_ids(&btf)?;
    patch(object, &ids)
}

/// `object` with the call at each site given `ids[which]`.
fn patch(object: &[u8], ids: &[u32]) -> Result<AlignedObject> {
    let sites = call_sites(object)?;
    let mut patched = AlignedObject::copy_of(object);
    let bytes = patched.bytes_mut();
    for (offset, which) in sites {
        bytes[offset + 4..offset + INSN_LEN].copy_from_slice(&ids[which].to_le_bytes());
    }
    Ok(patched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flatnet_common::kfunc::{KFUNC_CT_RELEASE, KFUNC_SKB_CT_LOOKUP, KFUNC_XDP_CT_LOOKUP};

    #[test]
    fn every_kfunc_is_called_and_every_call_is_patched() {
        let object = crate::bpf::object();
        let sites = call_sites(object).unwrap();
        for (placeholder, name) in PLACEHOLDERS {
            let which = PLACEHOLDERS
                .iter()
                .position(|(p, _)| *p == placeholder)
                .unwrap();
            assert!(
                sites.iter().any(|(_, w)| *w == which),
                "no call to {name} in the object"
            );
        }
        let ids = [11, 22, 33];
        let patched = patch(object, &ids).unwrap();
        assert!(call_sites(patched.bytes()).unwrap().is_empty());
        for (offset, which) in sites {
            let imm = &patched.bytes()[offset + 4..offset + 8];
            assert_eq!(u32::from_le_bytes(imm.try_into().unwrap()), ids[which]);
        }
        // Nothing else changed.
        let changed = object
            .iter()
            .zip(patched.bytes())
            .filter(|(a, b)| a != b)
            .count();
        assert!(changed <= call_sites(object).unwrap().len() * 4);
        assert_eq!(patched.bytes().len(), object.len());
        assert_ne!(KFUNC_SKB_CT_LOOKUP, KFUNC_XDP_CT_LOOKUP);
        assert_ne!(KFUNC_XDP_CT_LOOKUP, KFUNC_CT_RELEASE);
    }

    #[test]
    fn the_running_kernel_has_the_conntrack_kfuncs() {
        // /sys/kernel/btf/vmlinux is readable without root.
        let btf = Btf::from_sys_fs().expect("the kernel's BTF");
        let ids = kernel_ids(&btf).unwrap();
        assert!(ids.iter().all(|id| *id > 0));
    }
}

//! The shared libraries a host binary loads: how an ELF file is linked (from
//! its program headers), and the libraries `ldd` lists for it.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::util::output;

// --- Shared libraries ---------------------------------------------------------

/// How an ELF file is linked, from its program headers.
#[derive(Debug, PartialEq, Eq)]
enum Linking {
    NotElf,
    /// No PT_DYNAMIC: nothing to load.
    Static,
    /// PT_DYNAMIC: shared libraries (and, for executables, PT_INTERP).
    Dynamic,
}

const PT_DYNAMIC: u32 = 2;

/// Reads `file`'s ELF header and program headers (either class, either
/// byte order).
fn linking(file: &mut (impl Read + Seek)) -> io::Result<Linking> {
    let mut ident = [0u8; 64];
    let mut read = 0;
    while read < ident.len() {
        match file.read(&mut ident[read..])? {
            0 => break,
            n => read += n,
        }
    }
    if read < 16 || ident[..4] != *b"\x7fELF" {
        return Ok(Linking::NotElf);
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Ok(Linking::NotElf),
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return Ok(Linking::NotElf),
    };
    let u16_at = |bytes: &[u8], at: usize| -> Option<u64> {
        let b: [u8; 2] = bytes.get(at..at + 2)?.try_into().ok()?;
        Some(u64::from(if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }))
    };
    let u32_at = |bytes: &[u8], at: usize| -> Option<u64> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(u64::from(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }))
    };
    let u64_at = |bytes: &[u8], at: usize| -> Option<u64> {
        let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
        Some(if little {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        })
    };
    let header = &ident[..read];
    let fields = if wide {
        (
            u64_at(header, 0x20),
            u16_at(header, 0x36),
            u16_at(header, 0x38),
        )
    } else {
        (
            u32_at(header, 0x1c),
            u16_at(header, 0x2a),
            u16_at(header, 0x2c),
        )
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = fields else {
        return Ok(Linking::NotElf);
    };
    if phentsize < 4 || phnum == 0 {
        return Ok(Linking::Static);
    }
    let table_len = usize::try_from(phentsize * phnum).map_err(io::Error::other)?;
    let mut table = vec![0u8; table_len];
    file.seek(SeekFrom::Start(phoff))?;
    file.read_exact(&mut table)?;
    let entry_len = usize::try_from(phentsize).map_err(io::Error::other)?;
    let dynamic = table
        .chunks_exact(entry_len)
        .any(|entry| u32_at(entry, 0) == Some(u64::from(PT_DYNAMIC)));
    Ok(if dynamic {
        Linking::Dynamic
    } else {
        Linking::Static
    })
}

/// What `ldd` printed: the libraries found (with the program interpreter),
/// and the sonames it could not find.
#[derive(Debug, Default, PartialEq, Eq)]
struct LddOutput {
    found: Vec<PathBuf>,
    missing: Vec<String>,
}

/// Parses `ldd`'s lines: `name => /path (0x..)`, `/interpreter (0x..)`,
/// `name => not found`; the vDSO (no path) and "statically linked" are
/// nothing to copy.
fn parse_ldd(text: &str) -> LddOutput {
    let mut parsed = LddOutput::default();
    for line in text.lines().map(str::trim) {
        if let Some((name, resolved)) = line.split_once("=>") {
            let resolved = resolved.trim();
            if resolved.starts_with("not found") {
                parsed.missing.push(name.trim().to_string());
                continue;
            }
            let path = resolved.split(" (").next().unwrap_or_default().trim();
            if path.starts_with('/') {
                parsed.found.push(PathBuf::from(path));
            }
        } else if let Some(path) = line
            .split_whitespace()
            .next()
            .filter(|w| w.starts_with('/'))
        {
            parsed.found.push(PathBuf::from(path));
        }
    }
    parsed
}

/// The shared libraries and program interpreter `host` loads, transitively
/// (the dynamic loader resolves the whole closure for `ldd`); empty for a
/// static binary or a file that is not ELF.
pub(super) fn shared_libraries(host: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut file = File::open(host).with_context(|| format!("cannot open {}", host.display()))?;
    let linking = linking(&mut file)
        .with_context(|| format!("cannot read {}'s ELF header", host.display()))?;
    if linking != Linking::Dynamic {
        return Ok(Vec::new());
    }
    let text = output(Command::new("ldd").arg(host).env("LC_ALL", "C"))
        .with_context(|| format!("cannot list the shared libraries of {}", host.display()))?;
    let parsed = parse_ldd(&text);
    if !parsed.missing.is_empty() {
        bail!(
            "{} needs {}, which the dynamic loader cannot find: install the packages that provide them",
            host.display(),
            parsed.missing.join(", ")
        );
    }
    Ok(parsed.found)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn ldd_output_parsing() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd1b5f2000)\n\
            \tlibcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007f0a1c2f0000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0a1c0f0000)\n\
            \tlibisc-9.18.49-1~deb12u3-Debian.so => /lib/x86_64-linux-gnu/libisc-9.18.49-1~deb12u3-Debian.so (0x1)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f0a1c3b0000)\n";
        assert_eq!(
            parse_ldd(text),
            LddOutput {
                found: vec![
                    PathBuf::from("/lib/x86_64-linux-gnu/libcurl.so.4"),
                    PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                    PathBuf::from("/lib/x86_64-linux-gnu/libisc-9.18.49-1~deb12u3-Debian.so"),
                    PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
                ],
                missing: vec![],
            }
        );
        let text = "\tlinux-vdso.so.1 =>  (0x00007ffd1b5f2000)\n\
            \tlibfoo.so.1 => not found\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0a1c0f0000)\n";
        let parsed = parse_ldd(text);
        assert_eq!(parsed.missing, ["libfoo.so.1"]);
        assert_eq!(
            parsed.found,
            [PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")]
        );
        assert_eq!(parse_ldd("\tstatically linked\n"), LddOutput::default());
    }

    /// An ELF header and program header table with these segment types.
    fn elf(wide: bool, little: bool, types: &[u32]) -> Vec<u8> {
        let (phoff, phentsize) = if wide { (64usize, 56usize) } else { (52, 32) };
        let mut bytes = vec![0u8; phoff + phentsize * types.len()];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = if wide { 2 } else { 1 };
        bytes[5] = if little { 1 } else { 2 };
        let put = |bytes: &mut Vec<u8>, at: usize, value: u64, len: usize| {
            let all = if little {
                value.to_le_bytes()
            } else {
                value.to_be_bytes()
            };
            let field = if little { &all[..len] } else { &all[8 - len..] };
            bytes[at..at + len].copy_from_slice(field);
        };
        if wide {
            put(&mut bytes, 0x20, phoff as u64, 8);
            put(&mut bytes, 0x36, phentsize as u64, 2);
            put(&mut bytes, 0x38, types.len() as u64, 2);
        } else {
            put(&mut bytes, 0x1c, phoff as u64, 4);
            put(&mut bytes, 0x2a, phentsize as u64, 2);
            put(&mut bytes, 0x2c, types.len() as u64, 2);
        }
        for (i, kind) in types.iter().enumerate() {
            put(&mut bytes, phoff + i * phentsize, u64::from(*kind), 4);
        }
        bytes
    }

    #[test]
    fn elf_linking() {
        const PT_LOAD: u32 = 1;
        const PT_INTERP: u32 = 3;
        let check = |bytes: Vec<u8>| linking(&mut Cursor::new(bytes)).unwrap();
        assert_eq!(check(b"#!/bin/sh\n".to_vec()), Linking::NotElf);
        assert_eq!(check(Vec::new()), Linking::NotElf);
        for (wide, little) in [(true, true), (false, true), (true, false)] {
            assert_eq!(check(elf(wide, little, &[PT_LOAD])), Linking::Static);
            assert_eq!(
                check(elf(wide, little, &[PT_INTERP, PT_LOAD, PT_DYNAMIC])),
                Linking::Dynamic
            );
            // A shared object: PT_DYNAMIC without PT_INTERP.
            assert_eq!(
                check(elf(wide, little, &[PT_LOAD, PT_DYNAMIC])),
                Linking::Dynamic
            );
        }
    }
}

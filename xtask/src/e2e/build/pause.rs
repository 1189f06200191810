//! The pod sandbox's pause program: C source compiled statically with gcc
//! into the cache's `bin/pause`, and the check that it needs no loader.

use std::fs;
use std::process::Command;

use anyhow::{Context, bail};

use std::path::Path;

use crate::util::{heading, output, run_cmd};

/// The pod sandbox's process: no registry can be reached for
/// registry.k8s.io/pause, and all it must do is hold the namespaces, exit on
/// SIGINT/SIGTERM and reap what it inherits as PID 1.
const PAUSE_C: &str = r#"#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = quit;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    action.sa_handler = reap;
    action.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &action, NULL);
    for (;;) pause();
}
"#;

/// Compiles the pause program statically into `to`.
pub(super) fn pause(root: &Path, to: &Path) -> anyhow::Result<()> {
    heading("pause (static)");
    let dir = root.join("pause");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let source = dir.join("pause.c");
    fs::write(&source, PAUSE_C).with_context(|| format!("cannot write {}", source.display()))?;
    let partial = dir.join("pause");
    run_cmd(
        Command::new("gcc")
            .args(["-Os", "-static", "-s", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&partial)
            .arg(&source),
    )
    .context("cannot compile pause: gcc and libc6-dev (for the static libc) are needed")?;
    let elf = fs::read(&partial).with_context(|| format!("cannot read {}", partial.display()))?;
    if !is_static_elf(&elf) {
        bail!("{} is not a static ELF executable", partial.display());
    }
    fs::rename(&partial, to).with_context(|| format!("cannot write {}", to.display()))?;
    // It must run where nothing else is: no loader, no shared libraries.
    let said = output(Command::new("file").arg(to)).unwrap_or_default();
    println!("{}", said.trim());
    Ok(())
}

/// A 64-bit little-endian ELF executable with no program interpreter (no
/// PT_INTERP header): the kernel runs it without a dynamic loader.
fn is_static_elf(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8).map(|b| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(b);
            u64::from_le_bytes(bytes)
        })
    };
    // Magic, ELFCLASS64, ELFDATA2LSB.
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum))
        .all(|i| u32_at(phoff + i * usize::from(phentsize)).is_some_and(|kind| kind != PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_elf_check() {
        assert!(!is_static_elf(b"not an elf"));
        let mut elf = vec![0u8; 0x40 + 56];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        elf[0x20] = 0x40;
        elf[0x36] = 56;
        elf[0x38] = 1;
        elf[0x40] = 1; // PT_LOAD
        assert!(is_static_elf(&elf));
        elf[0x40] = 3; // PT_INTERP
        assert!(!is_static_elf(&elf));
    }
}

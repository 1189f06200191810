//! Builds the eBPF datapath (crate `flatnet-ebpf`) for bpfel-unknown-none with
//! `-Z build-std=core` and BTF, and leaves the object in OUT_DIR, where
//! `src/bpf/mod.rs` embeds it. `cargo xtask setup` installs what this needs.
//! The toolchain: `$FLATNET_EBPF_TOOLCHAIN`, else nightly when rustup has
//! it, else stable with `RUSTC_BOOTSTRAP=1` (which lets stable take `-Z`
//! flags; it ships the same LLVM as nightly does).
use std::env;
use std::path::{Path, PathBuf};

use sha2::Digest;

fn main() -> anyhow::Result<()> {
    // plugin/datapath: the workspace is two levels up.
    let workspace = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?)
        .ancestors()
        .nth(2)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("plugin/datapath has no workspace above it"))?;
    // bpf-linker lives in the project-local tool folder (see xtask setup).
    let tools_bin = workspace.join(".tools/bin");
    println!(
        "cargo:rerun-if-changed={}",
        tools_bin.join("bpf-linker").display()
    );
    if !tools_bin.join("bpf-linker").exists() && which_bpf_linker().is_none() {
        anyhow::bail!(
            "bpf-linker not found in {} or on PATH: run `cargo xtask setup` first",
            tools_bin.display()
        );
    }
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![tools_bin];
    dirs.extend(env::split_paths(&path));
    // SAFETY: build scripts are single-threaded; the child cargo inherits PATH.
    unsafe { env::set_var("PATH", env::join_paths(dirs)?) };

    println!("cargo:rerun-if-env-changed=FLATNET_EBPF_TOOLCHAIN");
    let toolchain = ebpf_toolchain();
    if toolchain != "nightly" {
        // SAFETY: as above; aya-build's cargo inherits it and then passes
        // `-Z build-std=core` to a stable compiler.
        unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    }
    let ebpf_dir = workspace.join("ebpf");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let object = out_dir.join("flatnet-ebpf");
    // Each variant of this crate (other features, clippy's) runs this script
    // with an OUT_DIR of its own, where aya-build would build the object
    // again, `core` included (~1.5 min). The object depends only on the
    // eBPF crate's and common's sources, Cargo.lock and the nightly
    // toolchain: kept once per profile under that key.
    let cached = out_dir.ancestors().nth(3).map(|profile| {
        profile
            .join("ebpf-object")
            .join(object_key(&workspace, &toolchain))
    });
    match &cached {
        Some(cached) if cached.exists() => {
            println!("cargo:rerun-if-changed={}", ebpf_dir.display());
            std::fs::copy(cached, &object)?;
        }
        _ => {
            let ebpf = aya_build::Package {
                name: "flatnet-ebpf",
                root_dir: ebpf_dir
                    .to_str()
                    .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?,
                ..Default::default()
            };
            aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom(&toolchain))?;
            if let Some(cached) = &cached {
                keep(&object, cached)?;
            }
        }
    }

    // The datapath's identity: pinned programs are named after it, so an ADD
    // can tell whether the pinned program is this build's without loading it.
    let digest = sha2::Sha256::digest(std::fs::read(&object)?);
    let id: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=FLATNET_DATAPATH_ID={id}");
    Ok(())
}

/// The toolchain the eBPF object is built with (see the top of this file;
/// xtask's setup chooses the same way: `util::ebpf_toolchain`).
fn ebpf_toolchain() -> String {
    if let Ok(chosen) = env::var("FLATNET_EBPF_TOOLCHAIN")
        && !chosen.is_empty()
    {
        return chosen;
    }
    let nightly = std::process::Command::new("rustup")
        .args(["run", "nightly", "rustc", "-V"])
        .output()
        .is_ok_and(|out| out.status.success());
    if nightly { "nightly" } else { "stable" }.to_string()
}

/// What the object is built from: every file of ebpf/ and common/ (build
/// output and hidden files aside), Cargo.lock, and the toolchain aya-build
/// uses (`rustc -vV`, its commit and LLVM included).
fn object_key(workspace: &Path, toolchain: &str) -> String {
    let mut hasher = sha2::Sha256::new();
    for dir in ["ebpf", "common"] {
        let mut files = Vec::new();
        collect_files(&workspace.join(dir), &mut files);
        files.sort();
        for file in files {
            hasher.update(
                file.strip_prefix(workspace)
                    .unwrap_or(&file)
                    .as_os_str()
                    .as_encoded_bytes(),
            );
            hasher.update(std::fs::read(&file).unwrap_or_default());
        }
    }
    hasher.update(std::fs::read(workspace.join("Cargo.lock")).unwrap_or_default());
    let toolchain = std::process::Command::new("rustup")
        .args(["run", toolchain, "rustc", "-vV"])
        .output()
        .map(|out| out.stdout)
        .unwrap_or_default();
    hasher.update(toolchain);
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, files);
        } else {
            files.push(path);
        }
    }
}

/// Copies the object to the cache, atomically (variants build side by side).
fn keep(object: &Path, cached: &Path) -> anyhow::Result<()> {
    let dir = cached
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no directory", cached.display()))?;
    std::fs::create_dir_all(dir)?;
    let temp = dir.join(format!(".{}.tmp", std::process::id()));
    std::fs::copy(object, &temp)?;
    std::fs::rename(&temp, cached)?;
    Ok(())
}

fn which_bpf_linker() -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.exists())
}

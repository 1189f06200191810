//! Builds the eBPF datapath (crate `flatnet-ebpf`) for bpfel-unknown-none with
//! nightly, `-Z build-std=core` and BTF, and leaves the object in OUT_DIR, where
//! `src/bpf/mod.rs` embeds it. `cargo xtask setup` installs what this needs.
use std::{env, path::PathBuf};

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

    let ebpf_dir = workspace.join("ebpf");
    let ebpf = aya_build::Package {
        name: "flatnet-ebpf",
        root_dir: ebpf_dir
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?,
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::default())?;

    // The datapath's identity: pinned programs are named after it, so an ADD
    // can tell whether the pinned program is this build's without loading it.
    let object = PathBuf::from(env::var("OUT_DIR")?).join("flatnet-ebpf");
    let digest = sha2::Sha256::digest(std::fs::read(&object)?);
    let id: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=FLATNET_DATAPATH_ID={id}");
    Ok(())
}

fn which_bpf_linker() -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.exists())
}

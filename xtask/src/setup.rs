//! Set-up of a fresh machine (what it installs: docs/development.md, Building), idempotent: each
//! step checks first and only installs what is missing.

use std::process::Command;

use anyhow::{Context, bail};

use crate::util::{self, heading, output, run_cmd};

/// Debian packages the build, tests, demo and benchmark use.
pub const PACKAGES: &[&str] = &[
    "bpftool",
    "containernetworking-plugins",
    "iproute2",
    "iputils-ping",
    "iperf3",
    "sockperf",
    "nftables",
    "tcpdump",
    "ethtool",
    "podman",
    "runc",
    "busybox-static",
    // tests/tests/integration/cri.rs: containerd's CRI plugin runs pod sandboxes on
    // flatnet as kubelet has it do; k8s-cri compiles its protos with protoc.
    "containerd",
    "protobuf-compiler",
    // conntrack -I: the datapath program tests write the entries they judge.
    "conntrack",
    "fonts-dejavu-core",
];

const BPF_LINKER_VERSION: &str = "0.13.0";

const CARGO_FUZZ_VERSION: &str = "0.13.2";

pub fn all() -> anyhow::Result<()> {
    rust_src()?;
    bpf_linker()?;
    cargo_fuzz()?;
    packages()?;
    bpftool_with_tcx()
}

/// bpftool 7.3 or later: older ones (bookworm's 7.1) list tcx links as
/// "type 11" without their device and leave them out of `bpftool net`, and
/// flatnet attaches through tcx. bookworm-backports has a newer one.
const BPFTOOL_TCX: (u32, u32) = (7, 3);

fn bpftool_version() -> Option<(u32, u32)> {
    let out = output(Command::new("bpftool").arg("version")).ok()?;
    let version = out.split_whitespace().nth(1)?.trim_start_matches('v');
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

fn bpftool_with_tcx() -> anyhow::Result<()> {
    if bpftool_version().is_some_and(|v| v >= BPFTOOL_TCX) {
        return Ok(());
    }
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    if !release.contains("VERSION_CODENAME=bookworm") {
        bail!(
            "bpftool {}.{} or later is needed to show tcx links; install it from your distribution",
            BPFTOOL_TCX.0,
            BPFTOOL_TCX.1
        );
    }
    heading("bpftool from bookworm-backports (tcx support)");
    if !util::is_root() {
        bail!("installing bpftool from bookworm-backports needs root: run this as root");
    }
    std::fs::write(
        "/etc/apt/sources.list.d/flatnet-bookworm-backports.list",
        "deb http://deb.debian.org/debian bookworm-backports main\n",
    )
    .context("adding bookworm-backports to apt's sources")?;
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(["-t", "bookworm-backports", "bpftool"]),
    )
}

/// cargo-fuzz in .tools/bin, for the fuzz smoke stage of `cargo xtask test`
/// (the targets themselves build with the eBPF toolchain).
fn cargo_fuzz() -> anyhow::Result<()> {
    let tools = util::root().join(".tools");
    if has_version(&tools.join("bin/cargo-fuzz"), CARGO_FUZZ_VERSION) {
        return Ok(());
    }
    heading(&format!("cargo-fuzz {CARGO_FUZZ_VERSION}"));
    run_cmd(
        Command::new("cargo")
            .args([
                "install",
                "cargo-fuzz",
                "--locked",
                "--version",
                CARGO_FUZZ_VERSION,
                "--root",
            ])
            .arg(&tools),
    )
}

/// True when the tool at `path` runs and says it is `version` (a pinned
/// version bump then installs the new one).
fn has_version(path: &std::path::Path, version: &str) -> bool {
    output(Command::new(path).arg("--version"))
        .is_ok_and(|said| said.split_whitespace().any(|word| word == version))
}

/// The eBPF toolchain's sysroot (`util::ebpf_toolchain`: nightly when
/// installed, else stable).
fn ebpf_sysroot() -> anyhow::Result<std::path::PathBuf> {
    let toolchain = util::ebpf_toolchain();
    let sysroot =
        output(Command::new("rustc").args([&format!("+{toolchain}"), "--print", "sysroot"]))
            .with_context(|| {
                format!("the {toolchain} toolchain (for the eBPF object) does not run")
            })?;
    Ok(std::path::PathBuf::from(sysroot.trim()))
}

/// The eBPF toolchain's rust-src, for `-Z build-std=core`.
fn rust_src() -> anyhow::Result<()> {
    let library = ebpf_sysroot()?.join("lib/rustlib/src/rust/library/core");
    if library.exists() {
        return Ok(());
    }
    let toolchain = util::ebpf_toolchain();
    heading(&format!("rust-src for {toolchain}"));
    run_cmd(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        &toolchain,
    ]))
}

/// bpf-linker in .tools/bin, linked against the libLLVM that ships inside
/// the eBPF toolchain (same LLVM major as its rustc; no system LLVM needed).
fn bpf_linker() -> anyhow::Result<()> {
    let tools = util::root().join(".tools");
    let linker = tools.join("bin/bpf-linker");
    let toolchain_lib = ebpf_sysroot()?.join("lib");
    let libllvm = std::fs::read_dir(&toolchain_lib)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| format!("no libLLVM.so.* in {}", toolchain_lib.display()))?;
    let llvm_dir = tools.join("llvm/lib");
    std::fs::create_dir_all(&llvm_dir)?;
    // LLVM_PREFIX wants lib/libLLVM.so at build time; the built binary asks
    // for the versioned soname at run time (found through its rpath here).
    let soname = libllvm.file_name().context("libLLVM has no file name")?;
    for link in [llvm_dir.join("libLLVM.so"), llvm_dir.join(soname)] {
        if std::fs::read_link(&link).ok().as_deref() != Some(libllvm.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&libllvm, &link)?;
        }
    }
    if has_version(&linker, BPF_LINKER_VERSION) {
        return Ok(());
    }
    heading(&format!(
        "bpf-linker {BPF_LINKER_VERSION} against {}",
        libllvm.display()
    ));
    let mut cmd = Command::new("cargo");
    cmd.env("LLVM_PREFIX", tools.join("llvm"))
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features", "llvm-22", "--root"])
        .arg(&tools);
    run_cmd(&mut cmd)
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn packages() -> anyhow::Result<()> {
    ensure_packages(PACKAGES)
}

/// Installs those of `packages` that are missing (none: nothing is run).
pub fn ensure_packages(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<_> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    heading(&format!("Debian packages: {}", missing.join(" ")));
    if !util::is_root() {
        bail!(
            "installing {} needs root: run this as root",
            missing.join(" ")
        );
    }
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
    )
}

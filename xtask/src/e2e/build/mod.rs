//! `cargo xtask e2e-build`: everything a real Kubernetes cluster test needs,
//! prepared idempotently. Debian packages (etcd, containerd, Go 1.19, ...),
//! Kubernetes 1.20.2 built from Debian bookworm's source package (the only
//! full tree with `vendor/` this machine can reach: no Go module proxy), the
//! e2e suite with its internet check removed, agnhost, and a static pause.
//!
//! Everything lands in `$FLATNET_CACHE/k8s-v1.20.2` (default
//! `/var/cache/flatnet`), outside the checkout, so a fresh clone on the same
//! machine reuses it; `bin/.complete` is written last and makes a second run
//! a check of stamps only.

mod internet_check;
mod kubernetes;
mod pause;
mod source;

use std::fmt;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};

use internet_check::verify_patched;
use kubernetes::kubernetes;
use pause::pause;
use source::{SOURCE_PACKAGE, SOURCE_VERSION, source};

/// Debian packages the cluster tests run or build with.
pub const PACKAGES: &[&str] = &[
    "golang-1.19-go",
    "etcd-server",
    "containerd",
    "runc",
    "gcc",
    "libc6-dev",
    "openssl",
    "conntrack",
    "iptables",
    // The test images' tools (e2e/images/): busybox's applets, and
    // Debian's where busybox's fall short or are missing.
    "busybox-static",
    "dash",
    "netcat-openbsd",
    "curl",
    "wget",
    "bind9-dnsutils",
    "bind9-host",
    "iproute2",
    "iperf",
    // The flatnet agent's image: nft, and the reference plugins it installs;
    // objcopy, which strips a debug build's debug info from it.
    "nftables",
    "binutils",
    "containernetworking-plugins",
    // The Kubernetes tree's own build: its Makefile, and rsync for placing
    // the binaries under _output/bin (Build-Depends of the source package).
    "make",
    "rsync",
];

const CACHE_SUBDIR: &str = "k8s-v1.20.2";
const DEFAULT_CACHE: &str = "/var/cache/flatnet";

/// Binaries copied from the tree's build output into `bin/`.
pub const KUBE_BINARIES: &[&str] = &[
    "kube-apiserver",
    "kubelet",
    "kube-proxy",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "e2e.test",
    "ginkgo",
    "agnhost",
    "regression-issue-74839",
];

/// Every binary `bin/` holds when complete.
pub fn binaries() -> impl Iterator<Item = &'static str> {
    KUBE_BINARIES.iter().copied().chain([PAUSE])
}

const PAUSE: &str = "pause";

const STAMP: &str = ".complete";

/// Where the prepared pieces are.
#[derive(Debug, Clone)]
pub struct Built {
    /// `<cache>/k8s-v1.20.2`: all of the below.
    pub root: PathBuf,
    /// The Kubernetes binaries, agnhost, ginkgo, e2e.test and pause.
    pub bin_dir: PathBuf,
    /// The patched Kubernetes tree (for the e2e suite's manifests, if needed).
    pub source_dir: PathBuf,
    /// Debian's etcd, which kube-apiserver 1.20 works with.
    pub etcd: PathBuf,
    /// Debian's containerd and runc (CRI for kubelet 1.20).
    pub containerd: PathBuf,
    pub runc: PathBuf,
}

impl Built {
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

impl fmt::Display for Built {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cache:       {}", self.root.display())?;
        writeln!(f, "source tree: {}", self.source_dir.display())?;
        writeln!(f, "binaries:    {}", self.bin_dir.display())?;
        for name in binaries() {
            writeln!(f, "  {}", self.bin(name).display())?;
        }
        writeln!(f, "etcd:        {}", self.etcd.display())?;
        writeln!(f, "containerd:  {}", self.containerd.display())?;
        write!(f, "runc:        {}", self.runc.display())
    }
}

/// The cache's layout, all under `root`.
struct Layout {
    root: PathBuf,
    bin: PathBuf,
    src: PathBuf,
    apt: PathBuf,
    download: PathBuf,
    gopath: PathBuf,
    gocache: PathBuf,
}

impl Layout {
    fn new(root: PathBuf) -> Self {
        Layout {
            bin: root.join("bin"),
            src: root.join("src"),
            apt: root.join("apt"),
            download: root.join("download"),
            gopath: root.join("gopath"),
            // Where the tree's hack/lib/golang.sh points GOCACHE (and GOPATH,
            // at _output/local/go) whatever the environment says; inside the
            // cache folder, so a rebuild takes seconds.
            gocache: root.join("src/_output/local/go/cache"),
            root,
        }
    }

    fn stamp(&self) -> PathBuf {
        self.bin.join(STAMP)
    }

    fn built(&self) -> Built {
        Built {
            root: self.root.clone(),
            bin_dir: self.bin.clone(),
            source_dir: self.src.clone(),
            etcd: PathBuf::from("/usr/bin/etcd"),
            containerd: PathBuf::from("/usr/bin/containerd"),
            runc: PathBuf::from("/usr/sbin/runc"),
        }
    }
}

/// `$FLATNET_CACHE` or `/var/cache/flatnet`, plus `k8s-v1.20.2`.
pub fn cache_root() -> PathBuf {
    std::env::var_os("FLATNET_CACHE")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
        .join(CACHE_SUBDIR)
}

/// Installs the missing packages, then fetches, patches and builds what the
/// stamp does not already vouch for.
pub fn prepare() -> anyhow::Result<Built> {
    packages()?;
    let layout = Layout::new(cache_root());
    let built = layout.built();
    for tool in [&built.etcd, &built.containerd, &built.runc] {
        if !tool.exists() {
            bail!(
                "{} is missing although its package is installed: reinstall it (apt-get install --reinstall)",
                tool.display()
            );
        }
    }
    if complete(&layout) {
        println!("e2e-build: {} is complete", layout.bin.display());
        return Ok(built);
    }

    fs::create_dir_all(&layout.root).with_context(|| {
        format!(
            "cannot create {}: run as root or set FLATNET_CACHE to a writable folder",
            layout.root.display()
        )
    })?;
    // Two runs at once (a CI job and a developer) would unpack and build
    // over each other; the second waits, then finds the stamp.
    let _lock = lock(&layout.root.join(".lock"))?;
    if complete(&layout) {
        println!(
            "e2e-build: {} was completed meanwhile",
            layout.bin.display()
        );
        return Ok(built);
    }

    source(&layout)?;
    verify_patched(&layout.src)?;
    kubernetes(&layout)?;
    pause(&layout)?;
    write_stamp(&layout)?;
    Ok(built)
}

fn lock(path: &Path) -> anyhow::Result<Flock<File>> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(lock),
        Err((file, _)) => {
            println!(
                "e2e-build: another e2e-build holds {}; waiting for it",
                path.display()
            );
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, errno)| errno)
                .with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// True when the stamp lists every binary with the size it has on disk.
fn complete(layout: &Layout) -> bool {
    let Ok(stamp) = fs::read_to_string(layout.stamp()) else {
        return false;
    };
    binaries().all(|name| {
        let Ok(meta) = fs::metadata(layout.bin.join(name)) else {
            return false;
        };
        stamp.lines().any(|line| {
            let mut words = line.split_whitespace();
            words.next() == Some(name) && words.next() == Some(meta.len().to_string().as_str())
        })
    })
}

fn write_stamp(layout: &Layout) -> anyhow::Result<()> {
    let mut text = format!("# {SOURCE_PACKAGE} {SOURCE_VERSION}, built by cargo xtask e2e-build\n");
    for name in binaries() {
        let path = layout.bin.join(name);
        let meta =
            fs::metadata(&path).with_context(|| format!("{} was not built", path.display()))?;
        text.push_str(&format!("{name} {}\n", meta.len()));
    }
    write_atomically(&layout.stamp(), text.as_bytes())?;
    println!("e2e-build: wrote {}", layout.stamp().display());
    Ok(())
}

/// Writes through a temporary file and a rename, so that a crash never
/// leaves a half-written file that looks finished.
fn write_atomically(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let partial = path.with_extension("partial");
    fs::write(&partial, contents).with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))
}

// --- Debian packages --------------------------------------------------------

fn packages() -> anyhow::Result<()> {
    crate::setup::ensure_packages(PACKAGES)
}

//! `cargo xtask e2e-build`: everything a real Kubernetes cluster test needs,
//! prepared idempotently. Kubernetes of the chosen release (the servers,
//! kubelet, kube-proxy, kubectl, the e2e suite, ginkgo, agnhost), etcd,
//! containerd 2 and cri-tools, each built from its Go module through the
//! Go module proxy by a small module of our own (`go_module.rs`); Debian's
//! runc; a static pause.
//!
//! Everything lands in `$FLATNET_CACHE/k8s-v<release>` (default
//! `/var/cache/flatnet`), outside the checkout, so a fresh clone on the same
//! machine reuses it; `bin/.complete` is written last and makes a second run
//! a check of stamps only.

mod background;
pub(crate) mod go_module;
mod kubernetes;
mod pause;
mod runtime;

use std::fmt;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};

pub use background::BackgroundBuild;
use kubernetes::kubernetes;
use pause::pause;
pub use runtime::{CNI_PLUGINS_DIR, CNI_PLUGINS_VERSION, CONTAINERD_VERSION, CRI_TOOLS_VERSION};

/// Debian packages the cluster tests run or build with.
pub const PACKAGES: &[&str] = &[
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
];

/// The Kubernetes release the clusters run unless `--kubernetes` says
/// otherwise: the newest the Go module proxy serves.
pub const DEFAULT_RELEASE: &str = "1.37.2";

const DEFAULT_CACHE: &str = "/var/cache/flatnet";

/// A Kubernetes release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Release {
    /// `v1.37.2`: the tag of `k8s.io/kubernetes`.
    pub fn tag(&self) -> String {
        format!("v{self}")
    }

    /// `v0.37.2`: the tag of its staging modules (`k8s.io/api`, ...).
    pub fn staging_tag(&self) -> String {
        format!("v0.{}.{}", self.minor, self.patch)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Release {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        let parts: Vec<&str> = text.trim_start_matches('v').split('.').collect();
        let [major, minor, patch] = parts[..] else {
            bail!(
                "a Kubernetes release is major.minor.patch (e.g. {DEFAULT_RELEASE}), not {text:?}"
            );
        };
        let number = |part: &str| {
            part.parse::<u32>()
                .with_context(|| format!("{part:?} in {text:?} is not a number"))
        };
        Ok(Release {
            major: number(major)?,
            minor: number(minor)?,
            patch: number(patch)?,
        })
    }
}

/// Binaries of the Kubernetes module in `bin/`.
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
    KUBE_BINARIES
        .iter()
        .chain(runtime::BINARIES)
        .copied()
        .chain([PAUSE])
}

const PAUSE: &str = "pause";

const STAMP: &str = ".complete";

/// Where the prepared pieces are.
#[derive(Debug, Clone)]
pub struct Built {
    pub release: Release,
    /// `<cache>/k8s-v1.37.2`: all of the below.
    pub root: PathBuf,
    /// Every binary built (Kubernetes, etcd, containerd, cri-tools, pause).
    pub bin_dir: PathBuf,
    /// The release's source (the module cache's read-only copy): the e2e
    /// suite's fixtures, agnhost's files.
    pub source_dir: PathBuf,
    /// Debian's runc (containerd's runtime).
    pub runc: PathBuf,
}

impl Built {
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    pub fn etcd(&self) -> PathBuf {
        self.bin("etcd")
    }

    pub fn containerd(&self) -> PathBuf {
        self.bin("containerd")
    }

    pub fn ctr(&self) -> PathBuf {
        self.bin("ctr")
    }
}

impl fmt::Display for Built {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Kubernetes:  {}", self.release)?;
        writeln!(f, "cache:       {}", self.root.display())?;
        writeln!(f, "source:      {}", self.source_dir.display())?;
        writeln!(f, "binaries:    {}", self.bin_dir.display())?;
        for name in binaries() {
            writeln!(f, "  {}", self.bin(name).display())?;
        }
        write!(f, "runc:        {}", self.runc.display())
    }
}

/// `$FLATNET_CACHE` or `/var/cache/flatnet`.
fn cache_base() -> PathBuf {
    std::env::var_os("FLATNET_CACHE")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
}

/// The release's folder in the cache.
pub fn cache_root(release: &Release) -> PathBuf {
    cache_base().join(format!("k8s-{}", release.tag()))
}

/// The source folder a complete build recorded in its stamp.
fn recorded_source(stamp: &str) -> Option<PathBuf> {
    stamp
        .lines()
        .find_map(|line| line.strip_prefix("# source "))
        .map(PathBuf::from)
}

/// Whether the release's binaries are built (its stamp vouches for them).
pub fn is_built(release: &Release) -> bool {
    complete(&cache_root(release).join("bin")).is_some()
}

/// Installs the missing packages, then builds what the stamp does not
/// already vouch for.
pub fn prepare(release: &Release) -> anyhow::Result<Built> {
    crate::setup::ensure_packages(PACKAGES)?;
    let root = cache_root(release);
    let bin = root.join("bin");
    let runc = PathBuf::from("/usr/sbin/runc");
    if !runc.exists() {
        bail!(
            "{} is missing although its package is installed: reinstall it (apt-get install --reinstall runc)",
            runc.display()
        );
    }
    let built = |source_dir: PathBuf| Built {
        release: *release,
        root: root.clone(),
        bin_dir: bin.clone(),
        source_dir,
        runc: runc.clone(),
    };
    if let Some(source) = complete(&bin) {
        println!("e2e-build: {} is complete", bin.display());
        return Ok(built(source));
    }
    fs::create_dir_all(&root).with_context(|| {
        format!(
            "cannot create {}: run as root or set FLATNET_CACHE to a writable folder",
            root.display()
        )
    })?;
    // Two runs at once (a CI job and a developer) would build over each
    // other; the second waits, then finds the stamp.
    let _lock = lock(&root.join(".lock"))?;
    if let Some(source) = complete(&bin) {
        println!("e2e-build: {} was completed meanwhile", bin.display());
        return Ok(built(source));
    }
    let started = std::time::Instant::now();
    let source = kubernetes(release, &root, &bin)?;
    runtime::build(&root, &bin)?;
    pause(&root, &bin.join(PAUSE))?;
    write_stamp(release, &bin, &source)?;
    println!(
        "e2e-build: Kubernetes {release} and its runtime built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(built(source))
}

/// For `cargo xtask critest`: [`prepare`] and cri-tools beside it, or,
/// given `binaries`, a folder of the same binaries built elsewhere
/// (containerd, its shim, ctr, crictl, critest, pause): for work on a task
/// that needs only those while e2e-build runs.
pub fn prepare_binaries(release: &Release, binaries: Option<&Path>) -> anyhow::Result<Built> {
    let Some(dir) = binaries else {
        let built = prepare(release)?;
        let _lock = lock(&built.root.join(".lock"))?;
        runtime::build_cri_tools(&built.root, &built.bin_dir)?;
        return Ok(built);
    };
    for name in [
        "containerd",
        "containerd-shim-runc-v2",
        "crictl",
        "critest",
        "pause",
        "cni/portmap",
        "cni/loopback",
    ] {
        if !dir.join(name).is_file() {
            bail!("{} has no {name}", dir.display());
        }
    }
    Ok(Built {
        release: *release,
        root: dir.to_path_buf(),
        bin_dir: dir.to_path_buf(),
        source_dir: dir.to_path_buf(),
        runc: PathBuf::from("/usr/sbin/runc"),
    })
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

/// Whether `release`'s binaries are all built (its stamp vouches for them).
pub fn is_complete(release: &Release) -> bool {
    complete(&cache_root(release).join("bin")).is_some()
}

/// The source folder, when the stamp lists every binary with the size it
/// has on disk and the source it was built from is still there.
fn complete(bin: &Path) -> Option<PathBuf> {
    let stamp = fs::read_to_string(bin.join(STAMP)).ok()?;
    let all_there = binaries().all(|name| {
        let Ok(meta) = fs::metadata(bin.join(name)) else {
            return false;
        };
        stamp.lines().any(|line| {
            let mut words = line.split_whitespace();
            words.next() == Some(name) && words.next() == Some(meta.len().to_string().as_str())
        })
    });
    let source = recorded_source(&stamp)?;
    (all_there && source.join("go.mod").exists()).then_some(source)
}

fn write_stamp(release: &Release, bin: &Path, source: &Path) -> anyhow::Result<()> {
    let mut text = format!(
        "# Kubernetes {release}, built by cargo xtask e2e-build\n# source {}\n",
        source.display()
    );
    for name in binaries() {
        let path = bin.join(name);
        let meta =
            fs::metadata(&path).with_context(|| format!("{} was not built", path.display()))?;
        text.push_str(&format!("{name} {}\n", meta.len()));
    }
    let stamp = bin.join(STAMP);
    let partial = stamp.with_extension("partial");
    fs::write(&partial, text).with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, &stamp).with_context(|| format!("cannot write {}", stamp.display()))?;
    println!("e2e-build: wrote {}", stamp.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_and_name_their_tags() {
        let release: Release = "1.37.2".parse().unwrap();
        assert_eq!(release.tag(), "v1.37.2");
        assert_eq!(release.staging_tag(), "v0.37.2");
        assert_eq!("v1.35.4".parse::<Release>().unwrap().minor, 35);
        assert!("1.37".parse::<Release>().is_err());
        assert!("1.x.2".parse::<Release>().is_err());
    }

    #[test]
    fn the_stamp_names_its_source() {
        let stamp = "# Kubernetes 1.37.2\n# source /m/k8s.io/kubernetes@v1.37.2\nkubelet 1\n";
        assert_eq!(
            recorded_source(stamp),
            Some(PathBuf::from("/m/k8s.io/kubernetes@v1.37.2"))
        );
    }
}

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

use std::fmt;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};

use crate::util::{heading, output, run_cmd};

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
    // The test images' tools (e2e/images.rs): busybox's applets, and
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

/// The source package, pinned: the cache folder is named after what it holds.
const SOURCE_PACKAGE: &str = "kubernetes";
const SOURCE_VERSION: &str = "1.20.5+really1.20.2-1.1+deb12u1";
const ORIG_TARBALL_PREFIX: &str = "kubernetes_1.20.5+really1.20.2.orig.tar.";
const SUITE: &str = "bookworm";

const CACHE_SUBDIR: &str = "k8s-v1.20.2";
const DEFAULT_CACHE: &str = "/var/cache/flatnet";

const GO_BIN: &str = "/usr/lib/go-1.19/bin";

/// What `hack/lib/version.sh` would read from git; the commit is v1.20.2's
/// (the same one the tarball's `git archive` substitution carries).
const VERSION_FILE: &str = "KUBE_GIT_VERSION='v1.20.2'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'
KUBE_GIT_TREE_STATE='clean'
";

/// The three `make WHAT=...` runs, in order: servers and kubectl, the e2e
/// suite with its runner, the suite's test image binary.
const MAKE_TARGETS: &[&str] = &[
    "cmd/kube-apiserver cmd/kubelet cmd/kube-proxy cmd/kube-controller-manager cmd/kube-scheduler cmd/kubectl",
    "test/e2e/e2e.test vendor/github.com/onsi/ginkgo/ginkgo",
    "test/images/agnhost test/images/regression-issue-74839",
];

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

/// The pod sandbox's process: no registry can be reached for
/// k8s.gcr.io/pause, and all it must do is hold the namespaces, exit on
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

const STAMP: &str = ".complete";

/// The file and the block in it that reach the internet.
const NETWORKING_GO: &str = "test/e2e/network/networking.go";
const INTERNET_GET: &str = "http.Get(\"http://google.com\")";
const INTERNET_HOST: &str = "google.com";
const PATCH_MARKER: &str = "flatnet: removed";

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

// --- The Kubernetes source --------------------------------------------------

/// One `deb` entry of the system's apt sources.
#[derive(Debug, PartialEq)]
struct AptEntry {
    uri: String,
    suites: Vec<String>,
    components: Vec<String>,
    signed_by: Option<String>,
}

impl AptEntry {
    fn serves(&self, suite: &str, component: &str) -> bool {
        self.suites.iter().any(|s| s == suite) && self.components.iter().any(|c| c == component)
    }
}

/// One-line format: `deb [opt=value ...] URI suite component...`.
fn parse_one_line(text: &str) -> Vec<AptEntry> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            continue;
        }
        let mut signed_by = None;
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for word in words.by_ref() {
                let option = word.trim_start_matches('[').trim_end_matches(']');
                if let Some(value) = option.strip_prefix("signed-by=") {
                    signed_by = Some(value.to_string());
                }
                if word.ends_with(']') {
                    break;
                }
            }
        }
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        entries.push(AptEntry {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
            signed_by,
        });
    }
    entries
}

/// deb822 format (`.sources`): stanzas of `Field: value` separated by blank
/// lines; continuation lines start with white space.
fn parse_deb822(text: &str) -> Vec<AptEntry> {
    let mut entries = Vec::new();
    for stanza in text.split("\n\n") {
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push('\n');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':') {
                fields.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let field = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let words = |name: &str| -> Vec<String> {
            field(name)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let enabled = field("enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        if !enabled || !words("types").iter().any(|t| t == "deb") {
            continue;
        }
        // Signed-By is a keyring path or an inline key; only a path fits a
        // one-line entry (apt's trusted keyrings cover the other case).
        let signed_by = field("signed-by")
            .filter(|v| !v.contains('\n') && !v.contains(' '))
            .map(str::to_string);
        for uri in words("uris") {
            entries.push(AptEntry {
                uri,
                suites: words("suites"),
                components: words("components"),
                signed_by: signed_by.clone(),
            });
        }
    }
    entries
}

/// The system's own `deb` entries, in the order apt reads them.
fn system_apt_entries() -> anyhow::Result<Vec<AptEntry>> {
    let mut entries = Vec::new();
    let main = Path::new("/etc/apt/sources.list");
    if main.exists() {
        let text =
            fs::read_to_string(main).with_context(|| format!("cannot read {}", main.display()))?;
        entries.extend(parse_one_line(&text));
    }
    let parts = Path::new("/etc/apt/sources.list.d");
    if parts.is_dir() {
        let mut files: Vec<PathBuf> = fs::read_dir(parts)
            .with_context(|| format!("cannot read {}", parts.display()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .collect();
        files.sort();
        for file in files {
            // apt reads only these two extensions; others are disabled.
            let parse: fn(&str) -> Vec<AptEntry> = match file.extension().and_then(|e| e.to_str()) {
                Some("list") => parse_one_line,
                Some("sources") => parse_deb822,
                _ => continue,
            };
            let text = fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            entries.extend(parse(&text));
        }
    }
    Ok(entries)
}

/// The private sources list: the `deb-src` twin of the system's bookworm
/// main entry, so the source comes from the mirror the machine already uses.
fn source_list_line(entries: &[AptEntry]) -> anyhow::Result<String> {
    let entry = entries
        .iter()
        .find(|entry| entry.serves(SUITE, "main"))
        .with_context(|| {
            format!(
                "no `deb` entry for {SUITE} main in /etc/apt/sources.list or /etc/apt/sources.list.d: \
                 add the Debian mirror this machine uses"
            )
        })?;
    let options = entry
        .signed_by
        .as_ref()
        .map(|keyring| format!("[signed-by={keyring}] "))
        .unwrap_or_default();
    Ok(format!("deb-src {options}{} {SUITE} main\n", entry.uri))
}

/// apt-get with a private sources list, lists and cache: the system's apt
/// configuration and state are not touched.
fn private_apt(layout: &Layout) -> Command {
    let mut cmd = Command::new("apt-get");
    let options = [
        format!(
            "Dir::Etc::SourceList={}",
            layout.apt.join("sources.list").display()
        ),
        "Dir::Etc::SourceParts=/nonexistent".to_string(),
        format!("Dir::State::Lists={}", layout.apt.join("lists").display()),
        format!("Dir::Cache={}", layout.apt.join("cache").display()),
        // Files in root-owned private folders: apt's _apt user could not
        // write there, and the fall-back only warns.
        "APT::Sandbox::User=root".to_string(),
    ];
    for option in options {
        cmd.args(["-o", &option]);
    }
    cmd
}

/// Downloads the source package and unpacks its `.orig` tarball into
/// `src/`, patched; `src/` appears only once all of that worked.
fn source(layout: &Layout) -> anyhow::Result<()> {
    if layout.src.join("go.mod").exists() {
        return Ok(());
    }
    heading(&format!(
        "Kubernetes source: Debian {SUITE} {SOURCE_PACKAGE} {SOURCE_VERSION}"
    ));
    let line = source_list_line(&system_apt_entries()?)?;
    for dir in [
        layout.apt.join("lists/partial"),
        layout.apt.join("cache/archives/partial"),
        layout.download.clone(),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let list = layout.apt.join("sources.list");
    fs::write(&list, &line).with_context(|| format!("cannot write {}", list.display()))?;
    println!("{}: {}", list.display(), line.trim());
    run_cmd(private_apt(layout).args(["update", "-qq"]))
        .context("cannot fetch the mirror's source index (apt-get update with the private list)")?;
    run_cmd(
        private_apt(layout)
            .current_dir(&layout.download)
            .args(["source", "--download-only"])
            .arg(format!("{SOURCE_PACKAGE}={SOURCE_VERSION}")),
    )
    .with_context(|| {
        format!(
            "cannot download the source package {SOURCE_PACKAGE} {SOURCE_VERSION}: \
             if the mirror no longer has it, see `apt-cache showsrc {SOURCE_PACKAGE}` with the list in {}",
            list.display()
        )
    })?;
    let tarball = fs::read_dir(&layout.download)
        .with_context(|| format!("cannot read {}", layout.download.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(ORIG_TARBALL_PREFIX))
        })
        .with_context(|| {
            format!(
                "apt-get source left no {ORIG_TARBALL_PREFIX}* in {}",
                layout.download.display()
            )
        })?;

    // Unpack next to src/ and rename: an interrupted unpack is redone, never
    // mistaken for a tree.
    let partial = layout.root.join("src.partial");
    if partial.exists() {
        fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove {}", partial.display()))?;
    }
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    run_cmd(
        Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&partial)
            .args(["--strip-components=1", "--no-same-owner"]),
    )
    .with_context(|| format!("cannot unpack {}", tarball.display()))?;
    for needed in [
        "go.mod",
        "vendor/modules.txt",
        "cmd/kube-apiserver",
        "test/e2e",
        "Makefile",
    ] {
        if !partial.join(needed).exists() {
            bail!(
                "{} has no {needed}: this source package does not carry the full Kubernetes tree",
                tarball.display()
            );
        }
    }
    patch_networking(&partial)?;
    fs::rename(&partial, &layout.src).with_context(|| {
        format!(
            "cannot rename {} to {}",
            partial.display(),
            layout.src.display()
        )
    })
}

// --- The e2e suite's internet check -------------------------------------------

/// e2e 1.20's `[sig-network] Networking` runs `http.Get("http://google.com")`
/// in a BeforeEach of every test it holds; the suite must never reach the
/// internet, so that block goes.
fn patch_networking(tree: &Path) -> anyhow::Result<()> {
    let path = tree.join(NETWORKING_GO);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let patched = remove_internet_check(&text).with_context(|| {
        format!(
            "cannot patch {}: look at it and adjust the patch",
            path.display()
        )
    })?;
    fs::write(&path, patched).with_context(|| format!("cannot write {}", path.display()))?;
    println!("e2e-build: removed the internet check from {NETWORKING_GO}");
    Ok(())
}

fn verify_patched(tree: &Path) -> anyhow::Result<()> {
    let path = tree.join(NETWORKING_GO);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    if text.contains(INTERNET_HOST) || !text.contains(PATCH_MARKER) {
        bail!(
            "{} is not patched (it still names {INTERNET_HOST} or lacks the patch's comment): \
             remove {} to unpack and patch it again",
            path.display(),
            tree.display()
        );
    }
    Ok(())
}

/// Removes the `ginkgo.BeforeEach(func() { ... })` that holds the internet
/// GET, found by its content and delimited by its braces, and the
/// `net/http` import when nothing else uses it (Go rejects unused imports).
fn remove_internet_check(text: &str) -> anyhow::Result<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let hit = lines
        .iter()
        .position(|line| line.contains(INTERNET_GET))
        .with_context(|| format!("no line calls {INTERNET_GET}"))?;
    let start = (0..=hit)
        .rev()
        .find(|&i| {
            lines[i]
                .trim_start()
                .starts_with("ginkgo.BeforeEach(func() {")
        })
        .with_context(|| {
            format!("no `ginkgo.BeforeEach(func() {{` above the line calling {INTERNET_GET}")
        })?;
    let end = block_end(&lines[start..])
        .map(|len| start + len)
        .context("the BeforeEach block's braces do not close")?;
    if end < hit || lines[end].trim() != "})" {
        bail!(
            "the BeforeEach at line {} does not end in `}})` after the line calling {INTERNET_GET}",
            start + 1
        );
    }
    let indent: String = lines[start]
        .chars()
        .take_while(|c| c.is_whitespace())
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in &lines[..start] {
        out.push_str(line);
    }
    out.push_str(&format!(
        "{indent}// {PATCH_MARKER} a BeforeEach that asserted internet access with an HTTP GET:\n\
         {indent}// the e2e suite must never reach the internet.\n"
    ));
    for line in &lines[end + 1..] {
        out.push_str(line);
    }
    if !uses_package(&out, "http") {
        let before = out.len();
        out = out
            .split_inclusive('\n')
            .filter(|line| line.trim() != "\"net/http\"")
            .collect();
        if out.len() == before {
            bail!("net/http is no longer used but its import line was not found");
        }
    }
    if out.contains(INTERNET_HOST) {
        bail!("{INTERNET_HOST} still appears after removing the block");
    }
    Ok(out)
}

/// Index (within `lines`) of the line where the braces opened on the first
/// line are all closed; strings, runes and comments are skipped.
fn block_end(lines: &[&str]) -> Option<usize> {
    let mut depth = 0i32;
    let mut opened = false;
    let mut in_raw = false;
    for (index, line) in lines.iter().enumerate() {
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if in_raw {
                in_raw = c != '`';
                continue;
            }
            match c {
                '`' => in_raw = true,
                '"' | '\'' => {
                    while let Some(d) = chars.next() {
                        if d == '\\' {
                            chars.next();
                        } else if d == c {
                            break;
                        }
                    }
                }
                '/' if chars.clone().next() == Some('/') => break,
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if opened && depth == 0 {
            return Some(index);
        }
    }
    None
}

/// True when `package.` appears as a qualified identifier outside comments.
fn uses_package(text: &str, package: &str) -> bool {
    let needle = format!("{package}.");
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .any(|code| {
            code.match_indices(&needle).any(|(at, _)| {
                !code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            })
        })
}

// --- The build ------------------------------------------------------------------

/// Runs the tree's own make with Debian's Go 1.19, then copies the binaries
/// into `bin/`. Each make is incremental (make's stamps, Go's cache), so
/// re-running after a failure only redoes what is missing.
fn kubernetes(layout: &Layout) -> anyhow::Result<()> {
    let go = Path::new(GO_BIN).join("go");
    if !go.exists() {
        bail!("{} is missing: install golang-1.19-go", go.display());
    }
    // A GOPATH whose k8s.io/kubernetes is the tree, and make runs there:
    // Go tools misbehave outside a GOPATH (the tree's scripts then build in
    // their own one under _output/local/go, linked the same way).
    let link = layout.gopath.join("src/k8s.io/kubernetes");
    if fs::read_link(&link).ok().as_deref() != Some(layout.src.as_path()) {
        let parent = link.parent().context("the GOPATH link has no parent")?;
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&layout.src, &link).with_context(|| {
            format!("cannot link {} to {}", link.display(), layout.src.display())
        })?;
    }
    let version_file = layout.root.join("version.env");
    fs::write(&version_file, VERSION_FILE)
        .with_context(|| format!("cannot write {}", version_file.display()))?;
    fs::create_dir_all(&layout.gocache)
        .with_context(|| format!("cannot create {}", layout.gocache.display()))?;

    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        std::iter::once(PathBuf::from(GO_BIN)).chain(std::env::split_paths(&path)),
    )
    .context("PATH cannot hold the Go 1.19 folder")?;
    for what in MAKE_TARGETS {
        heading(&format!("make WHAT=\"{what}\""));
        let started = Instant::now();
        let mut cmd = Command::new("make");
        cmd.current_dir(&link)
            .arg(format!("WHAT={what}"))
            .env("PATH", &path)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .env("GOPATH", &layout.gopath)
            .env("GOCACHE", &layout.gocache)
            // The tree builds in GOPATH mode with its vendor/ (its scripts
            // set GO111MODULE=off), so no -mod flag; and Go must never try
            // the network for a missing module.
            .env_remove("GOFLAGS")
            .env("GOPROXY", "off")
            .env("GOSUMDB", "off")
            .env("KUBE_GIT_VERSION_FILE", &version_file);
        run_cmd(&mut cmd).with_context(|| {
            format!(
                "building {what} failed: see the output above; a re-run resumes (delete {} to start over)",
                layout.root.display()
            )
        })?;
        println!("e2e-build: {what}: {:.0?}", started.elapsed());
    }

    // Go's own output: the copy into _output/local/bin is a convenience of
    // the tree's scripts (it needs rsync), this is where `go` wrote them.
    let out = layout.src.join("_output/local/go/bin");
    fs::create_dir_all(&layout.bin)
        .with_context(|| format!("cannot create {}", layout.bin.display()))?;
    for name in KUBE_BINARIES {
        let from = out.join(name);
        let to = layout.bin.join(name);
        let partial = layout.bin.join(format!(".{name}.partial"));
        fs::copy(&from, &partial)
            .with_context(|| format!("cannot copy {} (did the build make it?)", from.display()))?;
        fs::rename(&partial, &to).with_context(|| format!("cannot write {}", to.display()))?;
    }
    Ok(())
}

/// Compiles the pause program statically into `bin/pause`.
fn pause(layout: &Layout) -> anyhow::Result<()> {
    heading("pause (static)");
    let dir = layout.root.join("pause");
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
    let to = layout.bin.join(PAUSE);
    fs::rename(&partial, &to).with_context(|| format!("cannot write {}", to.display()))?;
    // It must run where nothing else is: no loader, no shared libraries.
    let said = output(Command::new("file").arg(&to)).unwrap_or_default();
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

    const NETWORKING: &str = r#"package network

import (
	"context"
	"net/http"
	"strconv"
)

var _ = SIGDescribe("Networking", func() {
	f := framework.NewDefaultFramework(svcname)

	ginkgo.BeforeEach(func() {
		// Assert basic external connectivity.
		ginkgo.By("Executing a successful http request from the external internet")
		resp, err := http.Get("http://google.com")
		if err != nil {
			framework.Failf("Unable to connect/talk to the internet: %v", err)
		}
		if resp.StatusCode != http.StatusOK {
			framework.Failf("Unexpected error code, expected 200, got, %v (%v)", resp.StatusCode, resp)
		}
	})

	ginkgo.It("should provide Internet connection", func() {
		checkConnectivityToHost(f, "", "connectivity-test", "8.8.8.8", 53, 30)
	})
})
"#;

    #[test]
    fn removes_the_block_and_the_unused_import() {
        let out = remove_internet_check(NETWORKING).unwrap();
        assert!(!out.contains("google.com"));
        assert!(!out.contains("\"net/http\""));
        assert!(!out.contains("ginkgo.BeforeEach"));
        assert!(out.contains(PATCH_MARKER));
        assert!(out.contains("\"strconv\""));
        assert!(out.contains("ginkgo.It(\"should provide Internet connection\""));
        assert!(out.contains("\tf := framework.NewDefaultFramework(svcname)\n"));
    }

    #[test]
    fn keeps_the_import_when_still_used() {
        let text = NETWORKING.replace("\tginkgo.It(", "\tvar _ = http.StatusOK\n\n\tginkgo.It(");
        let out = remove_internet_check(&text).unwrap();
        assert!(out.contains("\"net/http\""));
        assert!(!out.contains("google.com"));
    }

    #[test]
    fn fails_loudly_without_the_block() {
        let text = NETWORKING.replace("http.Get(\"http://google.com\")", "http.Get(url)");
        assert!(remove_internet_check(&text).is_err());
        let text = NETWORKING.replace(
            "ginkgo.BeforeEach(func() {",
            "ginkgo.JustBeforeEach(func() {",
        );
        assert!(remove_internet_check(&text).is_err());
    }

    #[test]
    fn braces_in_strings_do_not_count() {
        let lines = ["x(func() {\n", "  s := \"}\" + `}` + '}' // }\n", "})\n"];
        assert_eq!(block_end(&lines), Some(2));
    }

    #[test]
    fn package_use_is_a_whole_identifier() {
        assert!(uses_package("x := http.Get(u)", "http"));
        assert!(!uses_package("x := nethttp.Get(u)", "http"));
        assert!(!uses_package("// http.Get", "http"));
        assert!(!uses_package("import \"net/http\"", "http"));
    }

    #[test]
    fn finds_the_mirror_in_either_format() {
        let deb822 = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
            URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
            Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
            Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\
            Components: main\n";
        let entries = parse_deb822(deb822);
        assert_eq!(
            source_list_line(&entries).unwrap(),
            "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian bookworm main\n"
        );
        let one_line = "# comment\ndeb-src http://a/debian bookworm main\n\
            deb http://b/debian bookworm-backports main\n\
            deb [arch=amd64 signed-by=/k.gpg] http://c/debian bookworm main contrib\n";
        assert_eq!(
            source_list_line(&parse_one_line(one_line)).unwrap(),
            "deb-src [signed-by=/k.gpg] http://c/debian bookworm main\n"
        );
        assert!(source_list_line(&parse_one_line("deb http://b/debian trixie main\n")).is_err());
        let disabled =
            "Enabled: no\nTypes: deb\nURIs: http://x/debian\nSuites: bookworm\nComponents: main\n";
        assert!(parse_deb822(disabled).is_empty());
    }

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

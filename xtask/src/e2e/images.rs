//! The images a real cluster runs, built here and offline: no registry can
//! be reached from this machine, so every image the nodes run (the pod
//! sandbox, the e2e suite's test images, flatnet's agent, the cluster DNS)
//! is a docker-archive tarball written from Debian's binaries and ours, then
//! imported into each node's containerd with `ctr -n k8s.io images import`
//! (see ../shared/k8s-real.md).
//!
//! Three parts:
//! - [`Rootfs`]: what an image holds, as host files copied in (each
//!   dynamically linked ELF with its shared libraries and program
//!   interpreter, found with `ldd`), symlinks, directories and generated
//!   files. Image paths follow Debian's merged /usr: /bin, /sbin, /lib and
//!   /lib64 are symlinks into /usr, and files added under them land there.
//! - [`write_archive`]: a deterministic docker-archive (`manifest.json`, the
//!   config JSON and one uncompressed layer tar; entries sorted, mtime 0,
//!   owner root), so the same inputs always give the same image ID; and
//!   [`cached_archive`], which writes it only when its inputs changed.
//! - The images, one function each ([`pause`], [`agnhost`], [`busybox`], ...),
//!   named exactly as kubelet and the e2e suite of Kubernetes 1.20 ask for
//!   them, most on one shared [`toolbox`] of command-line tools.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::build::Built;
use crate::util::output;

// --- Image names ------------------------------------------------------------

/// kubelet 1.20's default sandbox image (`--pod-infra-container-image`),
/// and the e2e suite's `imageutils.GetPauseImageName()`.
pub const PAUSE: &str = "k8s.gcr.io/pause:3.2";
/// The names below are the e2e suite's, from
/// `test/utils/image/manifest.go` of Kubernetes 1.20.2.
pub const AGNHOST: &str = "k8s.gcr.io/e2e-test-images/agnhost:2.21";
pub const BUSYBOX: &str = "docker.io/library/busybox:1.29";
pub const JESSIE_DNSUTILS: &str = "gcr.io/kubernetes-e2e-test-images/jessie-dnsutils:1.0";
pub const NGINX: &[&str] = &[
    "docker.io/library/nginx:1.14-alpine",
    "docker.io/library/nginx:1.15-alpine",
];
pub const HTTPD: &[&str] = &[
    "docker.io/library/httpd:2.4.38-alpine",
    "docker.io/library/httpd:2.4.39-alpine",
];
/// `[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout`'s host
/// exec pod (`sleep`, `conntrack -L`, `grep`).
pub const DEBIAN_IPTABLES: &str = "k8s.gcr.io/build-image/debian-iptables:buster-v1.3.0";
/// The agent's DaemonSet image (xtask/deploy/kubernetes/daemonset.yaml).
/// The invalid-conntrack test's packet injector (built from the same tree).
pub const REGRESSION_74839: &str =
    "gcr.io/kubernetes-e2e-test-images/regression-issue-74839-amd64:1.0";
pub const FLATNET: &str = "localhost/flatnet:0.1.0";
pub const CLUSTER_DNS: &str = "localhost/flatnet-cluster-dns:0.1.0";

/// Debian's default search path, for every image that has a shell or tools.
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// --- Where host files come from ---------------------------------------------

/// Where a host file comes from: what to do when it is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A Debian package (each is in [`super::build::PACKAGES`], which
    /// `cargo xtask e2e-build` installs).
    Debian(&'static str),
    /// Built in this project or its cache; the sentence says how.
    Built(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Debian(package) => write!(
                f,
                "install the Debian package {package} (`apt-get install {package}`, or `cargo xtask e2e-build`)"
            ),
            Origin::Built(how) => f.write_str(how),
        }
    }
}

// --- The root file system ----------------------------------------------------

/// One path of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Dir {
        mode: u32,
    },
    /// A host file's contents; `host` is its canonical path (symlinks
    /// resolved), so the same file reached two ways is one entry.
    File {
        host: PathBuf,
        mode: u32,
    },
    /// Contents written here (configuration files, scripts).
    Bytes {
        contents: Vec<u8>,
        mode: u32,
    },
    Symlink {
        target: PathBuf,
    },
}

/// What an image's single layer holds, by absolute image path. Parent
/// directories not given explicitly are added (mode 0755) when written.
#[derive(Clone, Debug, Default)]
pub struct Rootfs {
    entries: BTreeMap<PathBuf, Entry>,
}

/// The top-level directories that are symlinks into /usr (merged /usr).
const MERGED_USR: &[&str] = &["bin", "sbin", "lib", "lib64"];

/// Where `path` lives in an image: absolute and normalized, with a path
/// under /bin, /sbin, /lib or /lib64 moved under /usr, since those four
/// are symlinks there (a file must never sit behind a symlink in a layer).
fn image_path(path: &Path) -> anyhow::Result<PathBuf> {
    if !path.is_absolute() {
        bail!("image path {} is not absolute", path.display());
    }
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => parts.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                bail!("image path {} is not a plain path", path.display())
            }
        }
    }
    let Some(first) = parts.first() else {
        bail!("the image's root is not a path to put things at");
    };
    let mut normalized = PathBuf::from("/");
    if first.to_str().is_some_and(|dir| MERGED_USR.contains(&dir)) {
        normalized.push("usr");
    }
    normalized.extend(parts);
    Ok(normalized)
}

impl Rootfs {
    /// An empty file system (what the pause image needs: one static binary).
    pub fn new() -> Self {
        Self::default()
    }

    /// The base of every image with tools: merged /usr, /tmp (1777), /root,
    /// root and nobody in /etc/passwd and /etc/group, and an nsswitch.conf
    /// that resolves host names from /etc/hosts, then DNS (what glibc's
    /// getaddrinfo, getent and curl read).
    pub fn base() -> Self {
        let mut rootfs = Self::new();
        for dir in MERGED_USR {
            rootfs.entries.insert(
                Path::new("/").join(dir),
                Entry::Symlink {
                    target: Path::new("usr").join(dir),
                },
            );
            rootfs
                .entries
                .insert(Path::new("/usr").join(dir), Entry::Dir { mode: 0o755 });
        }
        for (dir, mode) in [
            ("/etc", 0o755),
            ("/tmp", 0o1777),
            ("/var/tmp", 0o1777),
            ("/root", 0o700),
            ("/usr/local/bin", 0o755),
            ("/usr/local/sbin", 0o755),
        ] {
            rootfs.entries.insert(dir.into(), Entry::Dir { mode });
        }
        let files: [(&str, &str); 3] = [
            (
                "/etc/passwd",
                "root:x:0:0:root:/root:/bin/sh\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            ),
            (
                "/etc/group",
                "root:x:0:\nnobody:x:65534:\nnogroup:x:65534:\n",
            ),
            (
                "/etc/nsswitch.conf",
                "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n\
                 networks: files\nprotocols: files\nservices: files\n",
            ),
        ];
        for (path, contents) in files {
            rootfs.entries.insert(
                path.into(),
                Entry::Bytes {
                    contents: contents.as_bytes().to_vec(),
                    mode: 0o644,
                },
            );
        }
        rootfs
    }

    fn insert(&mut self, path: &Path, entry: Entry) -> anyhow::Result<()> {
        let path = image_path(path)?;
        match self.entries.get(&path) {
            Some(existing) if *existing == entry => Ok(()),
            Some(existing) => bail!(
                "{} would be in the image twice: as {existing:?} and as {entry:?}",
                path.display()
            ),
            None => {
                self.entries.insert(path, entry);
                Ok(())
            }
        }
    }

    /// A directory with this mode.
    pub fn dir(&mut self, path: &str, mode: u32) -> anyhow::Result<()> {
        self.insert(Path::new(path), Entry::Dir { mode })
    }

    /// A file with these contents.
    pub fn bytes(&mut self, path: &str, contents: &[u8], mode: u32) -> anyhow::Result<()> {
        self.insert(
            Path::new(path),
            Entry::Bytes {
                contents: contents.to_vec(),
                mode,
            },
        )
    }

    /// A symlink at `path` pointing at `target` (kept as given: relative
    /// targets resolve from `path`'s directory).
    pub fn symlink(&mut self, path: &str, target: &str) -> anyhow::Result<()> {
        self.insert(
            Path::new(path),
            Entry::Symlink {
                target: target.into(),
            },
        )
    }

    /// The host file `host` (symlinks followed) at `image`, with its mode;
    /// no libraries (data files, or binaries known to be static).
    pub fn copy(&mut self, host: &Path, image: &str, origin: &Origin) -> anyhow::Result<()> {
        let canonical = host_file(host, origin)?;
        let meta = fs::metadata(&canonical)
            .with_context(|| format!("cannot read {}", canonical.display()))?;
        self.insert(
            Path::new(image),
            Entry::File {
                host: canonical,
                mode: meta.permissions().mode() & 0o7777,
            },
        )
    }

    /// As [`copy`](Self::copy), plus, when `host` is a dynamically linked
    /// ELF file, its shared libraries and program interpreter at the paths
    /// the host's dynamic loader finds them (the image's loader finds them
    /// at the same paths: Debian's ld.so searches the multiarch directories
    /// without an ld.so.cache).
    pub fn binary(&mut self, host: &Path, image: &str, origin: &Origin) -> anyhow::Result<()> {
        self.copy(host, image, origin)?;
        self.libraries_of(host)
    }

    /// The shared library closure of `host` (nothing for a static binary or
    /// a file that is not ELF).
    pub fn libraries_of(&mut self, host: &Path) -> anyhow::Result<()> {
        for library in shared_libraries(host)? {
            let origin = Origin::Built(format!(
                "it is a library {} needs: reinstall the package that provides it",
                host.display()
            ));
            let image = library
                .to_str()
                .with_context(|| format!("{} is not UTF-8", library.display()))?
                .to_string();
            self.copy(&library, &image, &origin)?;
        }
        Ok(())
    }

    /// The host directory `host` at `image`, recursively: directories and
    /// files with their modes, symlinks as they are, and each ELF file's
    /// shared libraries.
    pub fn tree(&mut self, host: &Path, image: &str, origin: &Origin) -> anyhow::Result<()> {
        let canonical = host_file(host, origin)?;
        let meta = fs::metadata(&canonical)
            .with_context(|| format!("cannot read {}", canonical.display()))?;
        if !meta.is_dir() {
            bail!("{} is not a directory", host.display());
        }
        self.dir(image, meta.permissions().mode() & 0o7777)?;
        let mut children: Vec<_> = fs::read_dir(&canonical)
            .with_context(|| format!("cannot list {}", canonical.display()))?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("cannot list {}", canonical.display()))?;
        children.sort();
        for child in children {
            let name = child
                .file_name()
                .and_then(|name| name.to_str())
                .with_context(|| format!("{} is not a UTF-8 name", child.display()))?;
            let child_image = format!("{}/{name}", image.trim_end_matches('/'));
            let kind = fs::symlink_metadata(&child)
                .with_context(|| format!("cannot read {}", child.display()))?
                .file_type();
            if kind.is_symlink() {
                let target = fs::read_link(&child)
                    .with_context(|| format!("cannot read the link {}", child.display()))?;
                self.insert(Path::new(&child_image), Entry::Symlink { target })?;
            } else if kind.is_dir() {
                self.tree(&child, &child_image, origin)?;
            } else {
                self.binary(&child, &child_image, origin)?;
            }
        }
        Ok(())
    }

    /// Every entry with the directories they imply, parents first; an
    /// error when a path's parent is not a directory.
    fn complete(&self) -> anyhow::Result<BTreeMap<PathBuf, Entry>> {
        let mut all = self.entries.clone();
        for path in self.entries.keys() {
            for ancestor in path.ancestors().skip(1) {
                if ancestor == Path::new("/") {
                    break;
                }
                match all.get(ancestor) {
                    None => {
                        all.insert(ancestor.to_path_buf(), Entry::Dir { mode: 0o755 });
                    }
                    Some(Entry::Dir { .. }) => {}
                    Some(other) => bail!(
                        "{} cannot be in the image: its parent {} is {other:?}",
                        path.display(),
                        ancestor.display()
                    ),
                }
            }
        }
        Ok(all)
    }
}

/// The canonical path of a host file that must exist; a loud error naming
/// the file and what provides it otherwise.
fn host_file(host: &Path, origin: &Origin) -> anyhow::Result<PathBuf> {
    match fs::canonicalize(host) {
        Ok(canonical) => Ok(canonical),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!("{} is missing: {origin}", host.display())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", host.display())),
    }
}

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
fn shared_libraries(host: &Path) -> anyhow::Result<Vec<PathBuf>> {
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

// --- Images -------------------------------------------------------------------

/// One image: its names, its file system (one layer) and how it starts.
#[derive(Clone, Debug)]
pub struct ImageSpec {
    /// Every name it is imported under (`RepoTags`), fully qualified as
    /// containerd's CRI looks them up (`docker.io/library/busybox:1.29`).
    pub names: Vec<String>,
    pub rootfs: Rootfs,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
}

impl ImageSpec {
    /// `names` on `rootfs`, with PATH set, started in `/`.
    pub fn new(names: &[&str], rootfs: Rootfs) -> Self {
        ImageSpec {
            names: names.iter().map(|name| name.to_string()).collect(),
            rootfs,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec![PATH_ENV.to_string()],
            working_dir: "/".to_string(),
        }
    }

    fn entrypoint(mut self, args: &[&str]) -> Self {
        self.entrypoint = args.iter().map(|a| a.to_string()).collect();
        self
    }

    fn cmd(mut self, args: &[&str]) -> Self {
        self.cmd = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// The image config (what `docker inspect` calls Config), with the
    /// layer's diff ID.
    fn config(&self, diff_id: &str) -> Value {
        // null, not [], when unset: an empty Entrypoint is not "none".
        let args = |args: &[String]| {
            if args.is_empty() {
                Value::Null
            } else {
                json!(args)
            }
        };
        json!({
            "architecture": architecture(),
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Entrypoint": args(&self.entrypoint),
                "Cmd": args(&self.cmd),
                "Env": self.env,
                "WorkingDir": self.working_dir,
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{
                "created": "1970-01-01T00:00:00Z",
                "created_by": "cargo xtask e2e (xtask/src/e2e/images.rs)",
            }],
        })
    }
}

/// The GOARCH name of this machine's architecture, as image configs say it.
fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The sandbox image: the static pause program of the Kubernetes cache
/// (`bin/pause`, built by `cargo xtask e2e-build`) and nothing else.
pub fn pause(kube: &Built) -> anyhow::Result<ImageSpec> {
    let mut rootfs = Rootfs::new();
    rootfs.copy(&kube.bin("pause"), "/pause", &built_by_e2e_build())?;
    Ok(ImageSpec::new(&[PAUSE], rootfs).entrypoint(&["/pause"]))
}

fn built_by_e2e_build() -> Origin {
    Origin::Built("build it with `cargo xtask e2e-build`".to_string())
}

/// A Debian tool of the toolbox: its host file, where it goes, and links
/// to it. Each replaces busybox's applet of the same name.
struct Tool {
    host: &'static str,
    package: &'static str,
    image: &'static str,
    links: &'static [&'static str],
}

/// The toolbox's Debian tools, where busybox-static 1.35 falls short for
/// the e2e suite of 1.20 or has no such applet.
const TOOLBOX_TOOLS: &[Tool] = &[
    // /bin/sh: busybox's sh runs its own applets (its nc, its wget)
    // whatever PATH says; dash runs what PATH finds.
    Tool {
        host: "/usr/bin/dash",
        package: "dash",
        image: "/usr/bin/dash",
        links: &["/usr/bin/sh"],
    },
    // upstream's agnhost has bash (alpine's); no e2e test of sig-network
    // needs it, other suites' scripts might.
    Tool {
        host: "/usr/bin/bash",
        package: "bash",
        image: "/usr/bin/bash",
        links: &[],
    },
    // busybox's nc has no -u (UDP), which the suite's UDP checks use
    // (`echo hostName | nc -w 1 -u`, `nc -zv -u -w 2`), nor -p.
    Tool {
        host: "/usr/bin/nc.openbsd",
        package: "netcat-openbsd",
        image: "/usr/bin/nc.openbsd",
        links: &["/usr/bin/nc"],
    },
    // busybox-static 1.35's `wget -T N` segfaults; the suite runs
    // `wget -q -T 1 -O -` and `wget -T 5 -qO-`.
    Tool {
        host: "/usr/bin/wget",
        package: "wget",
        image: "/usr/bin/wget",
        links: &[],
    },
    Tool {
        host: "/usr/bin/curl",
        package: "curl",
        image: "/usr/bin/curl",
        links: &[],
    },
    // DNS tests: `dig +short`, `dig +notcp/+tcp +noall +answer +search`;
    // the service jig: `nslookup <service FQDN>`.
    Tool {
        host: "/usr/bin/dig",
        package: "bind9-dnsutils",
        image: "/usr/bin/dig",
        links: &[],
    },
    Tool {
        host: "/usr/bin/nslookup",
        package: "bind9-dnsutils",
        image: "/usr/bin/nslookup",
        links: &[],
    },
    Tool {
        host: "/usr/bin/host",
        package: "bind9-host",
        image: "/usr/bin/host",
        links: &[],
    },
    // DNS tests' `getent hosts <name>` (busybox has no getent); glibc's
    // files and dns NSS modules are part of libc.so.6 since 2.34.
    Tool {
        host: "/usr/bin/getent",
        package: "libc-bin",
        image: "/usr/bin/getent",
        links: &[],
    },
    // iproute2: `ss -ant46 'sport = :N'` (NodePort tests' host exec pod)
    // and a full `ip`, as upstream's agnhost has.
    Tool {
        host: "/usr/bin/ip",
        package: "iproute2",
        image: "/usr/bin/ip",
        links: &["/usr/sbin/ip"],
    },
    Tool {
        host: "/usr/bin/ss",
        package: "iproute2",
        image: "/usr/bin/ss",
        links: &[],
    },
    // networking_perf.go runs /usr/local/bin/iperf (iperf 2) in agnhost.
    Tool {
        host: "/usr/bin/iperf",
        package: "iperf",
        image: "/usr/bin/iperf",
        links: &["/usr/local/bin/iperf"],
    },
];

/// busybox-static's binary on the host.
const BUSYBOX_HOST: &str = "/bin/busybox";

/// The command-line tools the e2e suite's pods exec, shared by the test
/// images: busybox-static's applets (seq, timeout, hostname, awk, sleep,
/// nsenter, ...) as links to /bin/busybox, except where a Debian tool of
/// [`TOOLBOX_TOOLS`] takes the name, each with its shared libraries.
pub fn toolbox() -> anyhow::Result<Rootfs> {
    let mut rootfs = Rootfs::base();
    let busybox_origin = Origin::Debian("busybox-static");
    rootfs.binary(Path::new(BUSYBOX_HOST), "/usr/bin/busybox", &busybox_origin)?;
    let mut taken = BTreeSet::new();
    for tool in TOOLBOX_TOOLS {
        rootfs.binary(
            Path::new(tool.host),
            tool.image,
            &Origin::Debian(tool.package),
        )?;
        for path in std::iter::once(&tool.image).chain(tool.links) {
            let name = path.rsplit('/').next().unwrap_or(path);
            taken.insert(name.to_string());
        }
        for link in tool.links {
            // Relative when side by side, as Debian's own links are.
            let target = if Path::new(link).parent() == Path::new(tool.image).parent() {
                tool.image.rsplit('/').next().unwrap_or(tool.image)
            } else {
                tool.image
            };
            rootfs.symlink(link, target)?;
        }
    }
    // glibc loads libgcc_s when a thread is cancelled or unwinds; nothing
    // links it, so ldd does not list it.
    let libgcc = format!("/usr/lib/{}/libgcc_s.so.1", multiarch());
    rootfs.copy(Path::new(&libgcc), &libgcc, &Origin::Debian("libgcc-s1"))?;
    let applets = output(Command::new(BUSYBOX_HOST).arg("--list-full"))
        .with_context(|| format!("cannot list {BUSYBOX_HOST}'s applets"))?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let name = applet.rsplit('/').next().unwrap_or(applet);
        // linuxrc: the initramfs entry point, at the root; nothing to run.
        if name == "busybox" || name == "linuxrc" || taken.contains(name) {
            continue;
        }
        rootfs.symlink(&format!("/{applet}"), "/usr/bin/busybox")?;
    }
    Ok(rootfs)
}

/// The e2e suite's utility image: the toolbox plus agnhost from the
/// Kubernetes cache, laid out as upstream's Dockerfile does (`/agnhost`,
/// the `/agnhost-2` link the entrypoint tests run, porter's TLS pair in
/// `/`, netexec's `/uploads`). Upstream also has `/coredns` (CoreDNS
/// 1.6.2), which no Debian package or vendored source provides; in its
/// place, the cluster DNS server at `cluster_dns` ([`cluster_dns_binary`])
/// with its libraries: run as `/coredns -conf FILE` it serves the hosts
/// entries of the Corefile that "DNS should support configurable pod
/// resolv.conf" and the dns_configmap tests give it (tests/cluster-dns,
/// its CoreDNS mode).
pub fn agnhost(kube: &Built, cluster_dns: &Path) -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.binary(&kube.bin("agnhost"), "/agnhost", &built_by_e2e_build())?;
    rootfs.symlink("/agnhost-2", "agnhost")?;
    rootfs.binary(cluster_dns, "/coredns", &cluster_dns_origin())?;
    let porter = kube.source_dir.join("test/images/agnhost/porter");
    for name in ["localhost.crt", "localhost.key"] {
        rootfs.copy(
            &porter.join(name),
            &format!("/{name}"),
            &Origin::Built(
                "it is in the Kubernetes source tree: run `cargo xtask e2e-build`".to_string(),
            ),
        )?;
    }
    rootfs.dir("/uploads", 0o755)?;
    Ok(ImageSpec::new(&[AGNHOST], rootfs)
        .entrypoint(&["/agnhost"])
        .cmd(&["pause"]))
}

/// regression-issue-74839: "KubeProxy should resolve connection reset issue
/// #74839" sends an out-of-window TCP segment from it. The 1.20 tree's
/// source finds its address in `POD_IP`, which the 1.20 spec never sets
/// (upstream's 1.0 image predates that change), so the stand-in sets it
/// from the pod's own /etc/hosts before it starts.
pub fn regression_issue_74839(kube: &Built) -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.binary(
        &kube.bin("regression-issue-74839"),
        "/regression-issue-74839",
        &built_by_e2e_build(),
    )?;
    Ok(ImageSpec::new(&[REGRESSION_74839], rootfs).entrypoint(&[
        "/bin/sh",
        "-c",
        "POD_IP=\"${POD_IP:-$(hostname -i)}\" exec /regression-issue-74839",
    ]))
}

/// busybox:1.29, as the suite's generic shell image: the toolbox, `sh`.
pub fn busybox() -> anyhow::Result<ImageSpec> {
    Ok(ImageSpec::new(&[BUSYBOX], toolbox()?).cmd(&["sh"]))
}

/// jessie-dnsutils (Debian jessie with dnsutils upstream): the toolbox
/// has its dig, nslookup, host and getent.
pub fn jessie_dnsutils() -> anyhow::Result<ImageSpec> {
    Ok(ImageSpec::new(&[JESSIE_DNSUTILS], toolbox()?).cmd(&["sh"]))
}

/// Stands in for nginx 1.14/1.15-alpine: the toolbox, and busybox's httpd
/// serving nginx's document root `/usr/share/nginx/html` (an index.html) on
/// port 80, started by an `nginx` script that ignores its arguments so the
/// upstream `nginx -g 'daemon off;'` command works. What differs: it is no
/// nginx (no nginx.conf, no reverse proxy, no `nginx -s`), the tools are
/// the toolbox's rather than alpine's, and it exits on SIGTERM at once.
pub fn nginx() -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.bytes(
        "/usr/share/nginx/html/index.html",
        b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n\
          <body><h1>Welcome to nginx!</h1></body></html>\n",
        0o644,
    )?;
    rootfs.bytes(
        "/usr/sbin/nginx",
        static_server_script("nginx", "/usr/share/nginx/html").as_bytes(),
        0o755,
    )?;
    Ok(ImageSpec::new(NGINX, rootfs).cmd(&["nginx", "-g", "daemon off;"]))
}

/// Stands in for httpd 2.4.38/2.4.39-alpine: the toolbox, and busybox's
/// httpd serving Apache's document root `/usr/local/apache2/htdocs` on port
/// 80 through the upstream command `httpd-foreground`. A real file server
/// on the real path matters: the StatefulSet tests break and restore the
/// readiness probe by moving `htdocs/index.html` away and back, which a
/// server answering every path (agnhost netexec) would not notice. What
/// differs: no Apache (no modules, no httpd.conf, no CGI), the tools are
/// the toolbox's rather than alpine's, and it exits on SIGTERM at once.
pub fn httpd() -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.bytes(
        "/usr/local/apache2/htdocs/index.html",
        b"<html><body><h1>It works!</h1></body></html>\n",
        0o644,
    )?;
    rootfs.bytes(
        "/usr/local/bin/httpd-foreground",
        static_server_script("httpd", "/usr/local/apache2/htdocs").as_bytes(),
        0o755,
    )?;
    let mut spec = ImageSpec::new(HTTPD, rootfs).cmd(&["httpd-foreground"]);
    spec.working_dir = "/usr/local/apache2".to_string();
    Ok(spec)
}

/// A start script serving `root` on port 80 with busybox's httpd in the
/// foreground. The shell stays PID 1 with a TERM trap: as PID 1, busybox's
/// httpd would ignore SIGTERM and every pod deletion would wait out its
/// grace period.
fn static_server_script(stands_in_for: &str, root: &str) -> String {
    format!(
        "#!/bin/sh\n\
         # Stands in for {stands_in_for} (flatnet's e2e images): busybox's httpd\n\
         # serves {root} on port 80; arguments are ignored.\n\
         trap 'exit 0' TERM INT\n\
         /usr/bin/busybox httpd -f -v -p 80 -h {root} &\n\
         wait $!\n"
    )
}

/// debian-iptables (upstream: Debian buster with iptables and conntrack):
/// the toolbox with iptables (nft backend) and conntrack.
pub fn debian_iptables() -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    iptables(&mut rootfs)?;
    rootfs.binary(
        Path::new("/usr/sbin/conntrack"),
        "/usr/sbin/conntrack",
        &Origin::Debian("conntrack"),
    )?;
    Ok(ImageSpec::new(&[DEBIAN_IPTABLES], rootfs).cmd(&["/bin/sh"]))
}

/// The names xtables-nft-multi answers to, each a link to it in /usr/sbin.
const IPTABLES_NAMES: &[&str] = &[
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];

/// Debian's iptables, nft backend whatever the host's alternatives say:
/// xtables-nft-multi with links under the names it dispatches on, and the
/// extension modules it loads at run time from the xtables directory.
fn iptables(rootfs: &mut Rootfs) -> anyhow::Result<()> {
    let origin = Origin::Debian("iptables");
    rootfs.binary(
        Path::new("/usr/sbin/xtables-nft-multi"),
        "/usr/sbin/xtables-nft-multi",
        &origin,
    )?;
    for name in IPTABLES_NAMES {
        rootfs.symlink(&format!("/usr/sbin/{name}"), "xtables-nft-multi")?;
    }
    let xtables = format!("/usr/lib/{}/xtables", multiarch());
    rootfs.tree(Path::new(&xtables), &xtables, &origin)
}

/// Debian's multiarch triple for this machine (`x86_64-linux-gnu`).
fn multiarch() -> String {
    format!("{}-linux-gnu", std::env::consts::ARCH)
}

/// Where flatnet's own binaries are (the caller's build).
#[derive(Clone, Debug)]
pub struct FlatnetBinaries {
    /// flatnet-agent, dynamically linked (target/release/flatnet-agent).
    pub agent: PathBuf,
    /// The static plugins (target/<host triple>/release/flatnet, -ipam).
    pub plugin: PathBuf,
    pub ipam: PathBuf,
}

impl FlatnetBinaries {
    /// Where `cargo xtask build [--release]` puts them.
    pub fn of_build(release: bool) -> anyhow::Result<Self> {
        Ok(FlatnetBinaries {
            agent: crate::util::binary(release, crate::util::AGENT_PACKAGE)?,
            plugin: crate::util::binary(release, "flatnet")?,
            ipam: crate::util::binary(release, "flatnet-ipam")?,
        })
    }
}

/// The agent's DaemonSet image, as xtask/deploy/Containerfile builds it on
/// Debian: the agent and the two plugins in /usr/local/bin, Debian's
/// reference CNI plugins in /usr/lib/cni (installed onto nodes that lack
/// them), nft (ipMasq sets), iptables (portmap's DEL in the reclaim loop)
/// and ip (taking an old XDP program off a device).
pub fn flatnet(binaries: &FlatnetBinaries) -> anyhow::Result<ImageSpec> {
    let build = Origin::Built("build it with `cargo xtask build --release`".to_string());
    let mut rootfs = Rootfs::base();
    rootfs.binary(&binaries.agent, "/usr/local/bin/flatnet-agent", &build)?;
    rootfs.binary(&binaries.plugin, "/usr/local/bin/flatnet", &build)?;
    rootfs.binary(&binaries.ipam, "/usr/local/bin/flatnet-ipam", &build)?;
    rootfs.tree(
        Path::new("/usr/lib/cni"),
        "/usr/lib/cni",
        &Origin::Debian("containernetworking-plugins"),
    )?;
    rootfs.binary(
        Path::new("/usr/sbin/nft"),
        "/usr/sbin/nft",
        &Origin::Debian("nftables"),
    )?;
    iptables(&mut rootfs)?;
    rootfs.binary(
        Path::new("/usr/bin/ip"),
        "/usr/bin/ip",
        &Origin::Debian("iproute2"),
    )?;
    rootfs.symlink("/usr/sbin/ip", "../bin/ip")?;
    Ok(ImageSpec::new(&[FLATNET], rootfs).entrypoint(&["/usr/local/bin/flatnet-agent"]))
}

/// What to do when the cluster DNS server's binary is missing.
fn cluster_dns_origin() -> Origin {
    Origin::Built(
        "build it with `cargo build --release -p flatnet-cluster-dns` (tests/cluster-dns)"
            .to_string(),
    )
}

/// The cluster DNS server's image (tests/cluster-dns): the binary at
/// `binary` with its libraries, on the base (nsswitch.conf, /tmp).
pub fn cluster_dns(binary: &Path) -> anyhow::Result<ImageSpec> {
    let mut rootfs = Rootfs::base();
    rootfs.binary(
        binary,
        "/usr/local/bin/flatnet-cluster-dns",
        &cluster_dns_origin(),
    )?;
    Ok(ImageSpec::new(&[CLUSTER_DNS], rootfs).entrypoint(&["/usr/local/bin/flatnet-cluster-dns"]))
}

/// Every image the e2e suite's pods and the nodes' sandboxes use (not
/// flatnet's own two; agnhost carries the cluster DNS server at
/// `cluster_dns`, the caller's build of it, as `/coredns`).
pub fn test_images(kube: &Built, cluster_dns: &Path) -> anyhow::Result<Vec<ImageSpec>> {
    Ok(vec![
        pause(kube)?,
        agnhost(kube, cluster_dns)?,
        busybox()?,
        jessie_dnsutils()?,
        nginx()?,
        httpd()?,
        debian_iptables()?,
        regression_issue_74839(kube)?,
    ])
}

/// Where the cluster DNS server's binary is: tests/cluster-dns built with
/// `cargo build --release -p flatnet-cluster-dns`.
pub fn cluster_dns_binary(release: bool) -> PathBuf {
    crate::util::target_dir(release).join("flatnet-cluster-dns")
}

/// Every image a cluster of `cargo xtask e2e` runs, as archives in the
/// Kubernetes cache's `images/` folder (rebuilt only when their inputs
/// changed): the test images, flatnet's agent from the release (or the
/// debug) build ([`FlatnetBinaries::of_build`]) and the cluster DNS server
/// ([`cluster_dns_binary`], the same build in its image and in agnhost's).
pub fn for_cluster(kube: &Built, release: bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut cluster_dns_binary = cluster_dns_binary(release);
    let mut binaries = FlatnetBinaries::of_build(release)?;
    if !release {
        // A debug build's debug info is 80% of its size (the agent: 280 MB
        // of 345): every node would import it, and the agent's pod would
        // page it in under its memory limit. The code is the same without.
        let dir = crate::util::root().join("target/e2e/debug-stripped");
        cluster_dns_binary = without_debug_info(&cluster_dns_binary, &dir)?;
        binaries = FlatnetBinaries {
            agent: without_debug_info(&binaries.agent, &dir)?,
            plugin: without_debug_info(&binaries.plugin, &dir)?,
            ipam: without_debug_info(&binaries.ipam, &dir)?,
        };
    }
    let mut specs = test_images(kube, &cluster_dns_binary)?;
    specs.push(flatnet(&binaries)?);
    specs.push(cluster_dns(&cluster_dns_binary)?);
    cached_archives(&specs, &kube.root.join("images"))
}

/// A copy of `binary` in `dir` without its DWARF sections (`objcopy
/// --strip-debug`, binutils); symbols stay, so backtraces still name
/// functions.
fn without_debug_info(binary: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = binary
        .file_name()
        .with_context(|| format!("{} has no file name", binary.display()))?;
    let stripped = dir.join(name);
    crate::util::run_cmd(
        std::process::Command::new("objcopy")
            .arg("--strip-debug")
            .arg(binary)
            .arg(&stripped),
    )
    .with_context(|| format!("stripping {} (install binutils)", binary.display()))?;
    Ok(stripped)
}

// --- The archive ----------------------------------------------------------------

/// What [`write_archive`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveInfo {
    /// The config's digest (`sha256:...`): what `ctr images ls` and CRI
    /// call the image ID.
    pub image_id: String,
    /// The layer tar's digest (`sha256:...`), the config's only diff ID.
    pub diff_id: String,
    /// The archive's size in bytes.
    pub size: u64,
}

/// A writer that hashes and counts what passes through.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tar header of the kind the layer uses: owner root, mtime 0.
fn tar_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header
}

/// Writes `rootfs` as a layer tar: every entry, parents first, in path
/// order.
fn write_layer<W: Write>(rootfs: &Rootfs, out: W) -> anyhow::Result<W> {
    let mut tar = tar::Builder::new(out);
    for (path, entry) in rootfs.complete()? {
        let name = path.strip_prefix("/").unwrap_or(&path);
        let context = || format!("cannot write {} into the layer", path.display());
        match entry {
            Entry::Dir { mode } => {
                let mut header = tar_header(tar::EntryType::Directory, mode, 0);
                tar.append_data(&mut header, name, io::empty())
                    .with_context(context)?;
            }
            Entry::File { host, mode } => {
                let contents =
                    fs::read(&host).with_context(|| format!("cannot read {}", host.display()))?;
                let mut header = tar_header(tar::EntryType::Regular, mode, contents.len() as u64);
                tar.append_data(&mut header, name, contents.as_slice())
                    .with_context(context)?;
            }
            Entry::Bytes { contents, mode } => {
                let mut header = tar_header(tar::EntryType::Regular, mode, contents.len() as u64);
                tar.append_data(&mut header, name, contents.as_slice())
                    .with_context(context)?;
            }
            Entry::Symlink { target } => {
                let mut header = tar_header(tar::EntryType::Symlink, 0o777, 0);
                tar.append_link(&mut header, name, &target)
                    .with_context(context)?;
            }
        }
    }
    tar.into_inner().context("cannot finish the layer tar")
}

/// A file next to `path`, named after it, for work in progress.
fn sibling(path: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .with_context(|| format!("{} has no UTF-8 file name", path.display()))?;
    Ok(path.with_file_name(format!(".{name}.{suffix}.{}", std::process::id())))
}

/// Writes `spec` as a docker-archive at `out` (what `docker save` writes
/// and `ctr images import` reads): `manifest.json` naming the config, the
/// tags and the layer; the config as `<sha256>.json`; the layer as
/// `<diff id>/layer.tar`. Deterministic: the same spec and host files give
/// the same bytes. Written beside `out` and renamed into place.
pub fn write_archive(spec: &ImageSpec, out: &Path) -> anyhow::Result<ArchiveInfo> {
    if spec.names.is_empty() {
        bail!("an image needs at least one name");
    }
    let layer_path = sibling(out, "layer")?;
    let archive_path = sibling(out, "partial")?;
    let result = write_archive_via(spec, out, &layer_path, &archive_path);
    let _ = fs::remove_file(&layer_path);
    if result.is_err() {
        let _ = fs::remove_file(&archive_path);
    }
    result
}

fn write_archive_via(
    spec: &ImageSpec,
    out: &Path,
    layer_path: &Path,
    archive_path: &Path,
) -> anyhow::Result<ArchiveInfo> {
    let layer_file = File::create(layer_path)
        .with_context(|| format!("cannot create {}", layer_path.display()))?;
    let hashing = write_layer(
        &spec.rootfs,
        Hashing {
            inner: BufWriter::new(layer_file),
            hasher: Sha256::new(),
            written: 0,
        },
    )?;
    let diff_hex = hex(&hashing.hasher.finalize());
    let layer_size = hashing.written;
    hashing
        .inner
        .into_inner()
        .map_err(|e| anyhow!("cannot write {}: {}", layer_path.display(), e.error()))?
        .sync_all()
        .with_context(|| format!("cannot write {}", layer_path.display()))?;

    let diff_id = format!("sha256:{diff_hex}");
    let config = serde_json::to_vec(&spec.config(&diff_id)).context("cannot encode the config")?;
    let config_hex = hex(&Sha256::digest(&config));
    let config_name = format!("{config_hex}.json");
    let layer_name = format!("{diff_hex}/layer.tar");
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": spec.names,
        "Layers": [layer_name],
    }]))
    .context("cannot encode the manifest")?;

    let file = File::create(archive_path)
        .with_context(|| format!("cannot create {}", archive_path.display()))?;
    let mut tar = tar::Builder::new(BufWriter::new(file));
    let context = || format!("cannot write {}", archive_path.display());
    // In name order, as everything else.
    let mut members: Vec<(&str, Option<&[u8]>)> = vec![
        (config_name.as_str(), Some(config.as_slice())),
        (layer_name.as_str(), None),
        ("manifest.json", Some(manifest.as_slice())),
    ];
    members.sort_by_key(|(name, _)| *name);
    for (name, contents) in members {
        match contents {
            Some(bytes) => {
                let mut header = tar_header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
                tar.append_data(&mut header, name, bytes)
                    .with_context(context)?;
            }
            None => {
                let layer = File::open(layer_path)
                    .with_context(|| format!("cannot open {}", layer_path.display()))?;
                let mut header = tar_header(tar::EntryType::Regular, 0o644, layer_size);
                tar.append_data(&mut header, name, layer.take(layer_size))
                    .with_context(context)?;
            }
        }
    }
    let file = tar
        .into_inner()
        .with_context(context)?
        .into_inner()
        .map_err(|e| anyhow!("cannot write {}: {}", archive_path.display(), e.error()))?;
    file.sync_all().with_context(context)?;
    let size = file.metadata().with_context(context)?.len();
    fs::rename(archive_path, out).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(ArchiveInfo {
        image_id: format!("sha256:{config_hex}"),
        diff_id,
        size,
    })
}

/// Bump when the archive's layout changes: old archives become stale.
const ARCHIVE_FORMAT: &str = "flatnet-e2e-image 1";

/// A digest of everything the archive is made of: the writer's format, the
/// names and config, and every entry with its mode and contents (host
/// files read in full, so a rebuilt binary of the same size and time still
/// counts as changed).
fn input_digest(spec: &ImageSpec) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    let mut add = |value: Value| -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(&value).context("cannot encode the image's inputs")?;
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
        Ok(())
    };
    add(json!(ARCHIVE_FORMAT))?;
    add(json!(spec.names))?;
    add(spec.config(""))?;
    for (path, entry) in spec.rootfs.complete()? {
        let described = match entry {
            Entry::Dir { mode } => json!(["dir", path, mode]),
            Entry::File { host, mode } => {
                let mut file =
                    File::open(&host).with_context(|| format!("cannot read {}", host.display()))?;
                let mut digest = Sha256::new();
                io::copy(&mut file, &mut digest)
                    .with_context(|| format!("cannot read {}", host.display()))?;
                json!(["file", path, mode, hex(&digest.finalize())])
            }
            Entry::Bytes { contents, mode } => {
                json!(["file", path, mode, hex(&Sha256::digest(&contents))])
            }
            Entry::Symlink { target } => json!(["symlink", path, target]),
        };
        add(described)?;
    }
    Ok(hex(&hasher.finalize()))
}

/// The file name stem for an image: its first name, made file-safe.
fn archive_stem(spec: &ImageSpec) -> String {
    let name = spec.names.first().map(String::as_str).unwrap_or("image");
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The archive of `spec` in the folder `dir` (created if needed), written
/// only when no archive of the same inputs is there: the file name carries
/// a digest of them (`<name>-<digest>.tar`). Older archives of the same
/// image are removed.
pub fn cached_archive(spec: &ImageSpec, dir: &Path) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let stem = archive_stem(spec);
    let digest = input_digest(spec)?;
    let file_name = format!("{stem}-{}.tar", &digest[..16]);
    let path = dir.join(&file_name);
    if path.is_file() {
        return Ok(path);
    }
    let info = write_archive(spec, &path)?;
    println!(
        "image {}: {} ({} MB, ID {}, layer {})",
        spec.names.join(", "),
        path.display(),
        info.size / 1_000_000,
        info.image_id,
        info.diff_id
    );
    let stale_prefix = format!("{stem}-");
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_older = name != file_name
            && name
                .strip_prefix(&stale_prefix)
                .and_then(|rest| rest.strip_suffix(".tar"))
                .is_some_and(|key| key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()));
        if is_older {
            fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    Ok(path)
}

/// [`cached_archive`] of each spec, in order.
pub fn cached_archives(specs: &[ImageSpec], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    specs.iter().map(|spec| cached_archive(spec, dir)).collect()
}

/// Imports a docker-archive into the containerd at `address`, in the
/// `k8s.io` namespace where its CRI plugin (and so kubelet) looks, and
/// unpacks it into the default snapshotter (overlayfs, as CRI uses). No
/// platform flag: the archive holds one image whose config names this
/// machine's platform, which ctr's default matcher selects and unpacks
/// (`--all-platforms` would import without checking that).
#[allow(
    dead_code,
    reason = "the e2e harness runs ctr inside each node's namespaces itself; this is for a containerd of the host's"
)]
pub fn import(archive: &Path, ctr: &Path, address: &Path) -> anyhow::Result<()> {
    output(
        Command::new(ctr)
            .arg("--address")
            .arg(address)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(archive),
    )
    .with_context(|| format!("cannot import {}", archive.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh folder under the temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static COUNT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "flatnet-images-test-{}-{}",
                std::process::id(),
                COUNT.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A spec on host files of `dir`: an executable, a data file reached
    /// through a symlink, a link, a generated file, a sticky directory.
    fn sample_spec(dir: &Path) -> ImageSpec {
        let tool = dir.join("tool");
        fs::write(&tool, b"#!/bin/sh\necho tool\n").unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.join("data.txt");
        fs::write(&data, b"data").unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o640)).unwrap();
        symlink(&data, dir.join("data-link")).unwrap();
        let mut rootfs = Rootfs::base();
        rootfs
            .binary(&tool, "/bin/tool", &Origin::Debian("tool"))
            .unwrap();
        rootfs
            .copy(
                &dir.join("data-link"),
                "/srv/data.txt",
                &Origin::Debian("data"),
            )
            .unwrap();
        rootfs.symlink("/usr/local/bin/t", "/usr/bin/tool").unwrap();
        rootfs.bytes("/etc/motd", b"hello\n", 0o600).unwrap();
        rootfs.dir("/scratch", 0o1777).unwrap();
        ImageSpec::new(&["example.org/a:1", "example.org/b:2"], rootfs)
            .entrypoint(&["/bin/tool"])
            .cmd(&["--flag"])
    }

    /// Every member of a tar: name -> (header, contents).
    fn members(bytes: &[u8]) -> Vec<(String, tar::Header, Vec<u8>)> {
        let mut archive = tar::Archive::new(Cursor::new(bytes));
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let name = entry.path().unwrap().to_string_lossy().into_owned();
                let header = entry.header().clone();
                let mut contents = Vec::new();
                entry.read_to_end(&mut contents).unwrap();
                (name, header, contents)
            })
            .collect()
    }

    fn sha256(bytes: &[u8]) -> String {
        format!("sha256:{}", hex(&Sha256::digest(bytes)))
    }

    #[test]
    fn archive_layout_and_digests() {
        let dir = TempDir::new();
        let spec = sample_spec(&dir.0);
        let out = dir.0.join("image.tar");
        let info = write_archive(&spec, &out).unwrap();
        let bytes = fs::read(&out).unwrap();
        assert_eq!(info.size, bytes.len() as u64);
        let outer = members(&bytes);
        let find = |name: &str| {
            outer
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, _, c)| c.clone())
                .unwrap_or_else(|| panic!("{name} not in the archive"))
        };
        let manifest: Value = serde_json::from_slice(&find("manifest.json")).unwrap();
        let entry = &manifest[0];
        assert_eq!(
            entry["RepoTags"],
            json!(["example.org/a:1", "example.org/b:2"])
        );
        let config_name = entry["Config"].as_str().unwrap();
        let config_bytes = find(config_name);
        assert_eq!(
            format!("sha256:{}", config_name.trim_end_matches(".json")),
            sha256(&config_bytes)
        );
        assert_eq!(info.image_id, sha256(&config_bytes));
        let layer_name = entry["Layers"][0].as_str().unwrap();
        let layer = find(layer_name);
        let config: Value = serde_json::from_slice(&config_bytes).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"], json!([sha256(&layer)]));
        assert_eq!(info.diff_id, sha256(&layer));
        assert_eq!(layer_name, format!("{}/layer.tar", &sha256(&layer)[7..]));
        assert_eq!(config["os"], "linux");
        assert_eq!(config["architecture"], architecture());
        assert_eq!(config["config"]["Entrypoint"], json!(["/bin/tool"]));
        assert_eq!(config["config"]["Cmd"], json!(["--flag"]));
        assert_eq!(config["config"]["Env"], json!([PATH_ENV]));
        assert_eq!(config["config"]["WorkingDir"], "/");

        let layer = members(&layer);
        let names: Vec<&str> = layer.iter().map(|(n, _, _)| n.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_by(|a, b| Path::new(a).cmp(Path::new(b)));
        assert_eq!(names, sorted, "layer entries in path order");
        for (name, header, _) in &layer {
            assert_eq!(header.mtime().unwrap(), 0, "{name}");
            assert_eq!(header.uid().unwrap(), 0, "{name}");
            assert_eq!(header.gid().unwrap(), 0, "{name}");
        }
        let get = |name: &str| {
            layer
                .iter()
                .find(|(n, _, _)| n == name)
                .unwrap_or_else(|| panic!("{name} not in the layer: {names:?}"))
        };
        // Merged /usr: /bin/tool landed in /usr/bin, /bin is a link.
        let (_, header, contents) = get("usr/bin/tool");
        assert_eq!(header.mode().unwrap(), 0o755);
        assert_eq!(contents, b"#!/bin/sh\necho tool\n");
        let (_, header, _) = get("bin");
        assert_eq!(header.entry_type(), tar::EntryType::Symlink);
        assert_eq!(header.link_name().unwrap().unwrap(), Path::new("usr/bin"));
        // A host symlink is followed; the mode is the target's.
        let (_, header, contents) = get("srv/data.txt");
        assert_eq!(header.mode().unwrap(), 0o640);
        assert_eq!(contents, b"data");
        // Implied parents are directories.
        let (_, header, _) = get("srv");
        assert_eq!(header.entry_type(), tar::EntryType::Directory);
        assert_eq!(header.mode().unwrap(), 0o755);
        let (_, header, _) = get("scratch");
        assert_eq!(header.mode().unwrap(), 0o1777);
        let (_, header, _) = get("tmp");
        assert_eq!(header.mode().unwrap(), 0o1777);
        let (_, header, _) = get("usr/local/bin/t");
        assert_eq!(
            header.link_name().unwrap().unwrap(),
            Path::new("/usr/bin/tool")
        );
        let (_, header, contents) = get("etc/motd");
        assert_eq!(header.mode().unwrap(), 0o600);
        assert_eq!(contents, b"hello\n");
        let (_, _, passwd) = get("etc/passwd");
        let passwd = String::from_utf8_lossy(passwd);
        assert!(passwd.contains("root:x:0:0:") && passwd.contains("nobody:x:65534:"));
    }

    #[test]
    fn same_spec_same_bytes() {
        let dir = TempDir::new();
        let spec = sample_spec(&dir.0);
        let first = dir.0.join("first.tar");
        let second = dir.0.join("second.tar");
        let a = write_archive(&spec, &first).unwrap();
        let b = write_archive(&spec.clone(), &second).unwrap();
        assert_eq!(a, b);
        assert_eq!(fs::read(&first).unwrap(), fs::read(&second).unwrap());
        // No work files left beside them.
        let mut left: Vec<_> = fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tar"))
            .collect();
        left.sort();
        assert_eq!(left, ["first.tar", "second.tar"]);
    }

    #[test]
    fn cache_rebuilds_only_when_inputs_change() {
        let dir = TempDir::new();
        let cache = dir.0.join("cache");
        let spec = sample_spec(&dir.0);
        let first = cached_archive(&spec, &cache).unwrap();
        assert!(
            first
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("example.org_a_1-")
        );
        let written = fs::metadata(&first).unwrap().modified().unwrap();
        assert_eq!(cached_archive(&spec, &cache).unwrap(), first);
        assert_eq!(fs::metadata(&first).unwrap().modified().unwrap(), written);
        // Same size, other contents: a new archive, the old one gone.
        fs::write(dir.0.join("data.txt"), b"DATA").unwrap();
        let second = cached_archive(&spec, &cache).unwrap();
        assert_ne!(second, first);
        assert!(!first.exists());
        // A config change counts too.
        let third = cached_archive(&spec.clone().cmd(&["--other"]), &cache).unwrap();
        assert_ne!(third, second);
        assert_eq!(fs::read_dir(&cache).unwrap().count(), 1);
    }

    #[test]
    fn missing_host_file_names_the_package() {
        let mut rootfs = Rootfs::new();
        let err = rootfs
            .binary(
                Path::new("/nonexistent/flatnet-test-tool"),
                "/bin/x",
                &Origin::Debian("some-package"),
            )
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("/nonexistent/flatnet-test-tool is missing"),
            "{text}"
        );
        assert!(text.contains("apt-get install some-package"), "{text}");
    }

    #[test]
    fn conflicting_entries_are_refused() {
        let mut rootfs = Rootfs::base();
        rootfs.symlink("/bin/sh", "dash").unwrap();
        // The same entry again, even by its other path, is fine.
        rootfs.symlink("/usr/bin/sh", "dash").unwrap();
        assert!(rootfs.symlink("/bin/sh", "busybox").is_err());
        let mut rootfs = Rootfs::new();
        rootfs.bytes("/etc", b"not a dir", 0o644).unwrap();
        rootfs.bytes("/etc/passwd", b"", 0o644).unwrap();
        assert!(rootfs.complete().is_err());
    }

    #[test]
    fn image_paths_follow_merged_usr() {
        let cases = [
            ("/bin/sh", "/usr/bin/sh"),
            ("/sbin/ip", "/usr/sbin/ip"),
            (
                "/lib64/ld-linux-x86-64.so.2",
                "/usr/lib64/ld-linux-x86-64.so.2",
            ),
            (
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
            ),
            ("/usr/bin/curl", "/usr/bin/curl"),
            ("/binary", "/binary"),
            ("/./etc//passwd", "/etc/passwd"),
        ];
        for (given, expected) in cases {
            assert_eq!(image_path(Path::new(given)).unwrap(), Path::new(expected));
        }
        assert!(image_path(Path::new("bin/sh")).is_err());
        assert!(image_path(Path::new("/usr/../etc")).is_err());
        assert!(image_path(Path::new("/")).is_err());
    }

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

    /// A containerd of this test only (own root, state, socket, runc root
    /// and FIFOs under a temp dir; no CRI), stopped and removed on drop.
    struct PrivateContainerd {
        dir: TempDir,
        process: std::process::Child,
        /// /run/containerd, where shims put their sockets whatever the
        /// config says, when it was absent before.
        made_run_dir: bool,
    }

    impl PrivateContainerd {
        fn start() -> Self {
            let made_run_dir = !Path::new("/run/containerd").exists();
            let dir = TempDir::new();
            let config = flatnet_harness::containerd::ContainerdConfig {
                paths: Some(flatnet_harness::containerd::StatePaths {
                    root: dir.0.join("root"),
                    state: dir.0.join("state"),
                    socket: dir.0.join("containerd.sock"),
                    opt: dir.0.join("opt"),
                }),
                cri: None,
            }
            .to_toml();
            fs::write(dir.0.join("config.toml"), config).unwrap();
            let log = File::create(dir.0.join("containerd.log")).unwrap();
            let process = Command::new("/usr/bin/containerd")
                .arg("--config")
                .arg(dir.0.join("config.toml"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let containerd = PrivateContainerd {
                dir,
                process,
                made_run_dir,
            };
            for _ in 0..300 {
                if std::os::unix::net::UnixStream::connect(containerd.socket()).is_ok() {
                    return containerd;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            panic!(
                "containerd did not answer: {}",
                fs::read_to_string(containerd.dir.0.join("containerd.log")).unwrap_or_default()
            );
        }

        fn socket(&self) -> PathBuf {
            self.dir.0.join("containerd.sock")
        }

        fn ctr(&self) -> Command {
            let mut cmd = Command::new("/usr/bin/ctr");
            cmd.arg("--address")
                .arg(self.socket())
                .args(["--namespace", "k8s.io"]);
            cmd
        }

        /// `ctr run` of `image` in a network namespace of its own (loopback
        /// only: nothing leaves it); stdout and stderr, and the exit code.
        fn run(&self, image: &str, privileged: bool, args: &[&str]) -> (String, Option<i32>) {
            static COUNT: AtomicUsize = AtomicUsize::new(0);
            let id = format!(
                "flatnet-images-check-{}-{}",
                std::process::id(),
                COUNT.fetch_add(1, Ordering::Relaxed)
            );
            let mut cmd = self.ctr();
            cmd.args(["run", "--rm", "--runc-root"])
                .arg(self.dir.0.join("runc"))
                .arg("--fifo-dir")
                .arg(self.dir.0.join("fifo"))
                // One level under the root, which runc removes with the
                // container (a /k8s.io/<id> default would leave /k8s.io).
                .args(["--cgroup", &format!("/{id}")]);
            if privileged {
                cmd.arg("--privileged");
            }
            let out = cmd.arg(image).arg(&id).args(args).output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (text, out.status.code())
        }
    }

    impl Drop for PrivateContainerd {
        fn drop(&mut self) {
            let pid = nix::unistd::Pid::from_raw(self.process.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = self.process.wait();
            let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut ours: Vec<&str> = mounts
                .lines()
                .filter_map(|line| line.split_whitespace().nth(4))
                .filter(|mount| Path::new(mount).starts_with(&self.dir.0))
                .collect();
            ours.sort_by_key(|mount| std::cmp::Reverse(mount.len()));
            for mount in ours {
                let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
            }
            if self.made_run_dir {
                // Only when empty: someone else's shims may be there by now.
                let _ = fs::remove_dir("/run/containerd/s");
                let _ = fs::remove_dir("/run/containerd");
            }
        }
    }

    /// Imports the test images (and flatnet's two when their binaries are
    /// built) into a private containerd and runs what the e2e suite runs in
    /// them. Needs root, containerd and runc, and `cargo xtask e2e-build`'s
    /// cache; archives stay in target/e2e-images-check between runs.
    #[test]
    #[ignore = "root, containerd and the Kubernetes cache: run by hand"]
    fn containerd_runs_the_images() {
        assert!(crate::util::is_root(), "run this test as root");
        let root = super::super::build::cache_root();
        let kube = Built {
            bin_dir: root.join("bin"),
            source_dir: root.join("src"),
            etcd: PathBuf::from("/usr/bin/etcd"),
            containerd: PathBuf::from("/usr/bin/containerd"),
            runc: PathBuf::from("/usr/sbin/runc"),
            root,
        };
        // Built first by `cargo xtask build --release` and `cargo build
        // --release -p flatnet-cluster-dns`; missing ones fail the check.
        let cluster_dns_binary = cluster_dns_binary(true);
        let mut specs = test_images(&kube, &cluster_dns_binary).unwrap();
        let flatnet_binaries = FlatnetBinaries::of_build(true).unwrap();
        specs.push(flatnet(&flatnet_binaries).unwrap());
        specs.push(cluster_dns(&cluster_dns_binary).unwrap());
        let archives =
            cached_archives(&specs, &crate::util::root().join("target/e2e-images-check")).unwrap();

        let containerd = PrivateContainerd::start();
        for archive in &archives {
            import(archive, Path::new("/usr/bin/ctr"), &containerd.socket()).unwrap();
        }
        let listed = output(containerd.ctr().args(["images", "ls", "-q"])).unwrap();
        for spec in &specs {
            for name in &spec.names {
                assert!(
                    listed.lines().any(|l| l == name),
                    "{name} not imported: {listed}"
                );
            }
        }

        // (image, privileged, command, what its output must contain)
        let mut checks: Vec<(&str, bool, Vec<&str>, &str)> = vec![
            // /bin/sh is dash, and runs PATH's tools, not busybox's applets.
            (
                BUSYBOX,
                false,
                vec!["sh", "-c", "readlink /proc/$$/exe"],
                "/usr/bin/dash",
            ),
            (BUSYBOX, false, vec!["/bin/sh", "-c", "echo ok"], "ok"),
            (
                BUSYBOX,
                false,
                vec!["/bin/sh", "-c", "nc -h 2>&1 | head -n 1"],
                "OpenBSD netcat",
            ),
            (
                BUSYBOX,
                false,
                vec![
                    "sh",
                    "-c",
                    "nc -u -l -W 1 127.0.0.1 9999 & sleep 1; echo hostName | nc -w 1 -u 127.0.0.1 9999; wait",
                ],
                "hostName",
            ),
            (BUSYBOX, false, vec!["curl", "--version"], "curl 7.88"),
            (BUSYBOX, false, vec!["wget", "--version"], "GNU Wget"),
            (
                BUSYBOX,
                false,
                vec![
                    "sh",
                    "-c",
                    "wget -q -T 1 -O - http://127.0.0.1:1/; echo rc=$?",
                ],
                "rc=4",
            ),
            (JESSIE_DNSUTILS, false, vec!["dig", "-v"], "DiG 9.18"),
            (
                JESSIE_DNSUTILS,
                false,
                vec!["nslookup", "-version"],
                "nslookup 9.18",
            ),
            (JESSIE_DNSUTILS, false, vec!["host", "-V"], "host 9.18"),
            (
                JESSIE_DNSUTILS,
                false,
                vec![
                    "sh",
                    "-c",
                    "echo \"10.9.8.7 $(hostname)\" >> /etc/hosts; hostname -i; getent hosts $(hostname -s)",
                ],
                "10.9.8.7\n10.9.8.7",
            ),
            (
                BUSYBOX,
                false,
                vec![
                    "sh",
                    "-c",
                    "for i in $(seq 1 3); do echo -n $i; done; timeout 1 sleep 5; echo \" rc=$?\"",
                ],
                "123 rc=",
            ),
            (BUSYBOX, false, vec!["ip", "-V"], "iproute2"),
            (BUSYBOX, false, vec!["ss", "-ant46"], "State"),
            // The storage utils' HostExec: nsenter into PID 1's mount
            // namespace (here the container's own), then `sh -c`.
            (
                AGNHOST,
                true,
                vec![
                    "nsenter",
                    "--mount=/proc/1/ns/mnt",
                    "--",
                    "sh",
                    "-c",
                    "echo entered",
                ],
                "entered",
            ),
            (AGNHOST, false, vec!["/agnhost", "--help"], "netexec"),
            // The CoreDNS stand-in ("DNS should support configurable pod
            // resolv.conf"): runs, reads the Corefile it is given.
            (
                AGNHOST,
                false,
                vec![
                    "sh",
                    "-c",
                    "/coredns -conf /nonexistent 2>&1; echo \"exit=$?\"",
                ],
                "cannot read the Corefile /nonexistent: No such file or directory (os error 2)\nexit=1",
            ),
            (
                AGNHOST,
                false,
                vec![
                    "sh",
                    "-c",
                    "/agnhost netexec --http-port=8080 --udp-port=8081 >/dev/null 2>&1 & sleep 2; \
                     curl -g -q -s 'http://127.0.0.1:8080/dial?request=hostname&protocol=udp&host=127.0.0.1&port=8081&tries=1'",
                ],
                "{\"responses\":[",
            ),
            (
                NGINX[0],
                false,
                vec![
                    "sh",
                    "-c",
                    "nginx -g 'daemon off;' & sleep 1; wget -q -T 2 -O - http://127.0.0.1/",
                ],
                "Welcome to nginx!",
            ),
            (
                HTTPD[1],
                false,
                vec![
                    "sh",
                    "-c",
                    "httpd-foreground & sleep 1; curl -s http://127.0.0.1/index.html; \
                     mv /usr/local/apache2/htdocs/index.html /tmp/; \
                     curl -s -o /dev/null -w ' code=%{http_code}' http://127.0.0.1/index.html",
                ],
                "It works!</h1></body></html>\n code=404",
            ),
            (
                DEBIAN_IPTABLES,
                true,
                vec![
                    "sh",
                    "-c",
                    "iptables -A INPUT -p tcp --dport 80 -j ACCEPT && iptables-save | grep dport && conntrack -L",
                ],
                "--dport 80",
            ),
        ];
        checks.extend([
            (
                FLATNET,
                false,
                vec!["/usr/local/bin/flatnet", "--version"],
                "flatnet",
            ),
            (
                FLATNET,
                false,
                vec!["/usr/local/bin/flatnet-agent", "--help"],
                "Usage",
            ),
            (FLATNET, false, vec!["nft", "--version"], "nftables v1"),
            (FLATNET, false, vec!["iptables", "--version"], "(nf_tables)"),
            (
                FLATNET,
                true,
                vec![
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "POSTROUTING",
                    "-p",
                    "udp",
                    "-j",
                    "MASQUERADE",
                ],
                "",
            ),
            (
                FLATNET,
                false,
                vec!["/usr/lib/cni/portmap"],
                "CNI portmap plugin",
            ),
            (FLATNET, false, vec!["ip", "-V"], "iproute2"),
        ]);
        checks.push((
            CLUSTER_DNS,
            false,
            vec!["/usr/local/bin/flatnet-cluster-dns", "--help"],
            "Usage",
        ));
        let mut failed = Vec::new();
        for (image, privileged, args, expected) in &checks {
            let (said, code) = containerd.run(image, *privileged, args);
            let ok = said.contains(expected);
            println!(
                "{} {image} {args:?} (exit {code:?}):\n{}",
                if ok { "ok" } else { "FAILED" },
                said.trim_end()
            );
            if !ok {
                failed.push(format!("{image} {args:?}"));
            }
        }
        // The sandbox: PID 1 of its own PID namespace, exits on SIGTERM.
        let started = std::time::Instant::now();
        let mut pause = containerd.ctr();
        pause
            .args(["run", "--rm", "--runc-root"])
            .arg(containerd.dir.0.join("runc"))
            .arg("--fifo-dir")
            .arg(containerd.dir.0.join("fifo"))
            .args([
                "--cgroup",
                &format!("/flatnet-images-check-pause-{}", std::process::id()),
            ])
            .args([
                PAUSE,
                &format!("flatnet-images-check-pause-{}", std::process::id()),
            ]);
        let mut child = pause.spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
        assert!(
            child.try_wait().unwrap().is_none(),
            "pause exited by itself"
        );
        output(containerd.ctr().args([
            "task",
            "kill",
            "--signal",
            "SIGTERM",
            &format!("flatnet-images-check-pause-{}", std::process::id()),
        ]))
        .unwrap();
        let status = child.wait().unwrap();
        println!(
            "ok {PAUSE}: ran, exited on SIGTERM with {status} after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        assert!(status.success(), "pause exited with {status}");
        assert!(failed.is_empty(), "failed: {failed:#?}");
    }

    #[test]
    fn stems_are_file_safe() {
        let spec = ImageSpec::new(&[AGNHOST], Rootfs::new());
        assert_eq!(
            archive_stem(&spec),
            "k8s.gcr.io_e2e-test-images_agnhost_2.21"
        );
    }
}

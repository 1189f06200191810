//! What an image's single layer holds ([`Rootfs`]), and where the host
//! files put into it come from ([`Origin`]).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};

use super::shared_libraries::shared_libraries;

// --- Where host files come from ---------------------------------------------

/// Where a host file comes from: what to do when it is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A Debian package (each is in [`crate::e2e::build::PACKAGES`], which
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
pub(super) enum Entry {
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

    /// A file with these contents in place of whatever `path` was
    /// (an image's own /etc/passwd instead of the base's).
    pub fn replace_bytes(&mut self, path: &str, contents: &[u8], mode: u32) -> anyhow::Result<()> {
        let path = image_path(Path::new(path))?;
        self.entries.insert(
            path,
            Entry::Bytes {
                contents: contents.to_vec(),
                mode,
            },
        );
        Ok(())
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
    pub(super) fn complete(&self) -> anyhow::Result<BTreeMap<PathBuf, Entry>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

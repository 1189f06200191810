//! An image's docker-archive: written deterministically from its
//! [`ImageSpec`], cached by a digest of its inputs, imported into containerd.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::rootfs::{Entry, Rootfs};
use super::spec::ImageSpec;
use crate::util::output;

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

/// `rootfs` as a layer tar, in memory.
pub(super) fn layer_bytes(rootfs: &Rootfs) -> anyhow::Result<Vec<u8>> {
    write_layer(rootfs, Vec::new())
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
    use std::io::Cursor;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;
    use crate::e2e::images::rootfs::Origin;
    use crate::e2e::images::spec::architecture;
    use crate::e2e::images::tests::TempDir;
    use crate::e2e::images::{AGNHOST, PATH_ENV};

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
    fn stems_are_file_safe() {
        let spec = ImageSpec::new(&[AGNHOST[0]], Rootfs::new());
        assert_eq!(
            archive_stem(&spec),
            "registry.k8s.io_e2e-test-images_agnhost_2.66.1"
        );
    }
}

//! [`TestImages`]: the pause-like sandbox image and busybox, written as
//! one OCI image layout archive.

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, anyhow};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{BUSYBOX_IMAGE, PAUSE_IMAGE, hex};
use crate::{run_ok, unique};

const PAUSE_COMMAND: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
];

/// The test images as one OCI image layout archive (two manifests sharing
/// one busybox layer), built once per process into a cache directory.
pub struct TestImages;

static ARCHIVE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
static CACHE_DIR: OnceLock<PathBuf> = OnceLock::new();

impl TestImages {
    /// Where archives are kept between runs (the cargo target dir's tmp is
    /// a good place: `env!("CARGO_TARGET_TMPDIR")` in an integration test);
    /// the system temp dir when never said.
    pub fn set_cache_dir(dir: &Path) {
        let _ = CACHE_DIR.set(dir.to_path_buf());
    }

    /// The archive's path, built if this busybox has none yet.
    pub fn archive() -> anyhow::Result<PathBuf> {
        ARCHIVE
            .get_or_init(|| Self::build().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| anyhow!("building the test images: {e}"))
    }

    fn build() -> anyhow::Result<PathBuf> {
        let busybox = std::fs::read("/bin/busybox").context("reading /bin/busybox")?;
        let key = hex(&Sha256::digest(&busybox))[..16].to_string();
        let cache = CACHE_DIR
            .get()
            .cloned()
            .unwrap_or_else(std::env::temp_dir)
            .join("flatnet-cri-images");
        std::fs::create_dir_all(&cache).context("image cache dir")?;
        let archive = cache.join(format!("images-{key}.tar"));
        if archive.exists() {
            return Ok(archive);
        }
        let work = cache.join(unique("build-"));
        let result = Self::write_layout(&work, &archive);
        let _ = std::fs::remove_dir_all(&work);
        result.map(|()| archive)
    }

    /// Writes the OCI image layout in `work` and tars it to `archive`
    /// (by rename, so a concurrent build never exposes half a file).
    fn write_layout(work: &Path, archive: &Path) -> anyhow::Result<()> {
        let rootfs = work.join("rootfs");
        let blobs = work.join("layout/blobs/sha256");
        for dir in ["bin", "dev", "proc", "sys", "etc", "tmp", "var", "root"] {
            std::fs::create_dir_all(rootfs.join(dir))?;
        }
        std::fs::create_dir_all(&blobs)?;
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).context("copying busybox")?;
        let applets = run_ok(Command::new("/bin/busybox").arg("--list"));
        for applet in applets.lines().filter(|a| !a.is_empty() && *a != "busybox") {
            symlink("busybox", rootfs.join("bin").join(applet))?;
        }
        std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
        std::fs::write(rootfs.join("etc/group"), "root:x:0:\n")?;
        // The layer: an uncompressed tar, reproducible (sorted, no times or owners).
        let layer_tar = work.join("layer.tar");
        run_ok(
            Command::new("tar")
                .args([
                    "--sort=name",
                    "--owner=0",
                    "--group=0",
                    "--numeric-owner",
                    "--mtime=@0",
                    "-C",
                ])
                .arg(&rootfs)
                .arg("-cf")
                .arg(&layer_tar)
                .arg("."),
        );
        let layer = std::fs::read(&layer_tar)?;
        let layer_digest = put_blob(&blobs, &layer)?;
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let mut manifests = Vec::new();
        for (name, cmd) in [
            (PAUSE_IMAGE, PAUSE_COMMAND.to_vec()),
            (BUSYBOX_IMAGE, vec!["/bin/sh"]),
        ] {
            let config = json!({
                "architecture": arch,
                "os": "linux",
                "config": {
                    "Env": ["PATH=/bin"],
                    "Cmd": cmd,
                    "WorkingDir": "/",
                },
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
                "history": [{"created_by": "flatnet tests: busybox-static"}],
            });
            let config = serde_json::to_vec(&config)?;
            let manifest = json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": put_blob(&blobs, &config)?,
                    "size": config.len(),
                },
                "layers": [{
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": layer.len(),
                }],
            });
            let manifest = serde_json::to_vec(&manifest)?;
            let tag = name.rsplit(':').next().unwrap_or("latest");
            manifests.push(json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": put_blob(&blobs, &manifest)?,
                "size": manifest.len(),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    // ctr names the image after this one.
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }));
        }
        let index: Value = json!({"schemaVersion": 2, "manifests": manifests});
        let layout = work.join("layout");
        std::fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
        std::fs::write(
            layout.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        let partial = work.join("images.tar");
        run_ok(
            Command::new("tar")
                .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
                .arg("-C")
                .arg(&layout)
                .arg("-cf")
                .arg(&partial)
                .args(["oci-layout", "index.json", "blobs"]),
        );
        std::fs::rename(&partial, archive).context("placing the image archive")?;
        Ok(())
    }
}

/// Stores `bytes` as a content-addressed blob; its digest ("sha256:…").
fn put_blob(blobs: &Path, bytes: &[u8]) -> anyhow::Result<String> {
    let digest = hex(&Sha256::digest(bytes));
    let mut file = std::fs::File::create(blobs.join(&digest))?;
    file.write_all(bytes)?;
    Ok(format!("sha256:{digest}"))
}

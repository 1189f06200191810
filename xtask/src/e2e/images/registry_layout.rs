//! The files `agnhost fake-registry-server` serves. Upstream's agnhost
//! image carries `/var/registry`, written when the image is built (pause
//! 3.10.2 fetched with crane, served as `pause:testing`); the
//! LocalhostNodePorts spec has a node pull that image from it through a
//! NodePort on localhost. Here the same layout is written from the pause
//! image built from source: a tag file naming the manifest's digest, the
//! manifest, and the config and layer blobs, each at
//! `<dir>/sha256/<first two hex digits>/<hex>/data`.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::archive::layer_bytes;
use super::rootfs::Rootfs;
use super::spec::ImageSpec;

/// The fake registry's folder in agnhost.
const REGISTRY: &str = "/var/registry";

/// `image` under `REGISTRY/<name>` as `<name>:<tag>` in `rootfs`.
pub fn add_image(
    rootfs: &mut Rootfs,
    name: &str,
    tag: &str,
    image: &ImageSpec,
) -> anyhow::Result<()> {
    let layer = layer_bytes(&image.rootfs)?;
    let diff_id = digest(&layer);
    let config = serde_json::to_vec(&image.config(&diff_id))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": diff_id,
            "size": layer.len(),
        }],
    }))?;
    let dir = format!("{REGISTRY}/{name}");
    let manifest_digest = digest(&manifest);
    rootfs.bytes(
        &format!("{dir}/manifests/{tag}"),
        manifest_digest.as_bytes(),
        0o644,
    )?;
    rootfs.bytes(
        &stored_at(&format!("{dir}/manifests"), &manifest_digest),
        &manifest,
        0o644,
    )?;
    for blob in [config, layer] {
        rootfs.bytes(
            &stored_at(&format!("{dir}/blobs"), &digest(&blob)),
            &blob,
            0o644,
        )?;
    }
    Ok(())
}

fn digest(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Where the fake registry looks for `digest` under `base`.
fn stored_at(base: &str, digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    format!("{base}/sha256/{}/{hex}/data", &hex[..2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_stored_as_the_fake_registry_reads_them() {
        assert_eq!(
            stored_at("/var/registry/pause/blobs", "sha256:abcdef"),
            "/var/registry/pause/blobs/sha256/ab/abcdef/data"
        );
        assert_eq!(
            digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}

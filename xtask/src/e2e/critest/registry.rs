//! The registry critest pulls from: go-containerregistry's `crane
//! registry serve` (a registry of the OCI distribution API), built from
//! its Go module like everything of e2e-build, listening on the machine's
//! own loopback; the stand-in images pushed into it with `crane push`;
//! containerd's `certs.d` pointing the registries critest names at it
//! (and every other one at a closed port, so nothing leaves the machine).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use super::super::build::go_module::{self, GoModule};
use super::super::daemon::Daemon;
use super::super::host::Host;

const GGCR: &str = "github.com/google/go-containerregistry";
const GGCR_VERSION: &str = "v0.22.1";

/// Where the registry listens, in the critest machine's own network
/// namespace.
pub const ADDRESS: &str = "127.0.0.1:5000";

/// The registries critest's images are named after: served by ours.
pub const MIRRORED: &[&str] = &["registry.k8s.io", "k8s.gcr.io", "gcr.io"];
/// Registries nothing here should ask: a closed port, failing at once.
const CLOSED: &[&str] = &["docker.io", "registry-1.docker.io", "quay.io", "ghcr.io"];
const CLOSED_PORT: &str = "http://127.0.0.1:9";

/// `crane` in `cache/bin`, built from its module when missing or of
/// another version.
pub fn crane(cache: &Path) -> anyhow::Result<PathBuf> {
    let bin = cache.join("bin");
    let crane = bin.join("crane");
    let stamp = bin.join("crane.version");
    if crane.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|v| v.trim() == GGCR_VERSION) {
        return Ok(crane);
    }
    let module = GoModule {
        name: "registry",
        requires: vec![(GGCR.to_string(), GGCR_VERSION.to_string())],
        replaces: Vec::new(),
        commands: vec![(format!("{GGCR}/cmd/crane"), "crane".to_string())],
        test_binaries: Vec::new(),
        ldflags: Vec::new(),
        tags: Vec::new(),
        sources: Vec::new(),
    };
    go_module::build(&module, cache, &bin)?;
    std::fs::write(&stamp, GGCR_VERSION)
        .with_context(|| format!("cannot write {}", stamp.display()))?;
    Ok(crane)
}

/// A `certs.d/<registry>/hosts.toml`: ours (plain HTTP on loopback) for
/// the mirrored registries, a closed port for the others.
pub fn hosts_toml(registry: &str) -> String {
    if MIRRORED.contains(&registry) {
        let ours = format!("http://{ADDRESS}");
        format!(
            "# {registry}: flatnet's critest registry (stand-in images) on loopback.\n\
             server = \"{ours}\"\n\n[host.\"{ours}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        )
    } else {
        format!(
            "# {registry} cannot be reached from here: fail at once.\n\
             server = \"{CLOSED_PORT}\"\n\n[host.\"{CLOSED_PORT}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        )
    }
}

/// Writes the `certs.d` folder at `dir`.
pub fn write_certs_d(dir: &Path) -> anyhow::Result<()> {
    for registry in MIRRORED.iter().chain(CLOSED) {
        let folder = dir.join(registry);
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("cannot create {}", folder.display()))?;
        std::fs::write(folder.join("hosts.toml"), hosts_toml(registry))
            .with_context(|| format!("cannot write {}", folder.display()))?;
    }
    Ok(())
}

/// Where `name` (`registry.k8s.io/pause:3.9`) is pushed in ours:
/// `127.0.0.1:5000/pause:3.9`, the path containerd asks the mirror for.
pub fn pushed_as(name: &str) -> anyhow::Result<String> {
    let Some((registry, path)) = name.split_once('/') else {
        bail!("{name} names no registry");
    };
    if !MIRRORED.contains(&registry) {
        bail!("{name} is not of a registry critest's containerd is pointed at ours for");
    }
    Ok(format!("{ADDRESS}/{path}"))
}

/// Starts the registry on `host`, its blobs in `dir`, and waits until it
/// answers the API's version check.
pub fn start(host: &Host, crane: &Path, dir: &Path, logs: &Path) -> anyhow::Result<Daemon> {
    let mut cmd = host.command(crane);
    cmd.args(["registry", "serve", "--address", ADDRESS, "--disk"])
        .arg(dir);
    let mut daemon = Daemon::start(host, "registry", cmd, logs)?;
    let url = format!("http://{ADDRESS}/v2/");
    daemon.wait_ready(Duration::from_secs(30), "its /v2/ answering", || {
        host.run("curl", &["-fsS", "-o", "/dev/null", &url]).is_ok()
    })?;
    Ok(daemon)
}

/// Pushes the docker-archive `archive` under each of `names`.
pub fn push(host: &Host, crane: &Path, archive: &Path, names: &[String]) -> anyhow::Result<()> {
    for name in names {
        let target = pushed_as(name)?;
        let crane = crane.display().to_string();
        let archive_arg = archive.display().to_string();
        host.run(&crane, &["push", "--insecure", &archive_arg, &target])
            .with_context(|| format!("cannot push {} as {target}", archive.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_the_paths_containerd_asks_the_mirror_for() {
        assert_eq!(
            pushed_as("registry.k8s.io/e2e-test-images/busybox:1.29-2").unwrap(),
            "127.0.0.1:5000/e2e-test-images/busybox:1.29-2"
        );
        assert_eq!(
            pushed_as("k8s.gcr.io/pause:3.9").unwrap(),
            "127.0.0.1:5000/pause:3.9"
        );
        assert!(pushed_as("docker.io/library/busybox:1").is_err());
        assert!(pushed_as("busybox").is_err());
    }

    #[test]
    fn mirrored_registries_are_ours_and_the_rest_closed() {
        let ours = hosts_toml("gcr.io");
        assert!(
            ours.contains("server = \"http://127.0.0.1:5000\""),
            "{ours}"
        );
        assert!(ours.contains("[host.\"http://127.0.0.1:5000\"]"));
        let closed = hosts_toml("docker.io");
        assert!(
            closed.contains("server = \"http://127.0.0.1:9\""),
            "{closed}"
        );
    }
}

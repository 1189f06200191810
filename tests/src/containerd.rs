//! A real containerd (1.6, Debian's package) with its CRI plugin: the
//! container runtime of a Kubernetes node, which runs the node's CNI
//! conflist through libcni for every pod sandbox kubelet asks for.
//!
//! [`Containerd`] starts one that only its test uses: its own root, state,
//! socket and config file under a fresh temporary directory, the CNI conf
//! and bin dirs the test gives, runc's state under its state dir. On drop,
//! every sandbox still there is stopped and removed through CRI (so CNI
//! DEL runs), then containerd and its shims are killed, everything mounted
//! under its directories is unmounted and the directories removed, and the
//! few machine paths containerd creates whatever its configuration says are
//! removed again when the tests made them.
//!
//! [`TestImages`] are the images a node would pull: a pause-like sandbox
//! image and busybox for app containers, both written here as an OCI image
//! layout (no registry, no podman) from busybox-static, and imported with
//! `ctr images import` into the `k8s.io` namespace, where CRI looks.

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use flatnet_harness::containerd::{ContainerdConfig, Cri, StatePaths};

use crate::cri::CriClient;
use crate::{POLL_INTERVAL, poll_until, run_ok, unique};

/// The pause-like sandbox image: waits forever, exits on SIGTERM (PID 1 of
/// its PID namespace gets only the signals it handles, hence the trap).
pub const PAUSE_IMAGE: &str = "localhost/flatnet-test-pause:1";
/// busybox-static with its applet links, for app containers.
pub const BUSYBOX_IMAGE: &str = "localhost/flatnet-test-busybox:1";

const PAUSE_COMMAND: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
];

const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";
const RUNC: &str = "/usr/sbin/runc";
const SHIM: &str = "containerd-shim-runc-v2";
/// Where shims listen, whatever containerd's state dir.
const SHIM_SOCKETS: &str = "/run/containerd/s";

/// What the CRI tests need on the machine: (path, Debian package).
pub const TOOLS: &[(&str, &str)] = &[
    (CONTAINERD, "containerd"),
    (CTR, "containerd"),
    (RUNC, "runc"),
    ("/bin/busybox", "busybox-static"),
];

/// Paths containerd, its shims and libcni create on the machine whatever
/// the configuration says: the shims' sockets (/run/containerd/s), libcni's
/// result cache (/var/lib/cni, which containerd's CRI uses as well) and the
/// sandboxes' network namespaces (/run/netns/cni-*). Removed again, when
/// empty of others' files, by the last guard of the process that found
/// them absent.
const MACHINE_PATHS: &[&str] = &[
    "/run/containerd/s",
    "/run/containerd",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/netns",
];

/// Live guards of this process and the machine paths absent before the
/// first of them started.
static MACHINE: Mutex<(usize, Vec<&'static str>)> = Mutex::new((0, Vec::new()));

/// containerd makes /run/netns a shared bind mount of itself (as `ip netns
/// add` does) the first time it creates a sandbox's netns.
const NETNS_DIR: &str = "/run/netns";

fn is_mount_point(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(path))
}

fn machine() -> std::sync::MutexGuard<'static, (usize, Vec<&'static str>)> {
    MACHINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A containerd of one test.
pub struct Containerd {
    dir: PathBuf,
    process: Option<Child>,
    /// The network namespace containerd runs in (a simulated node's), where
    /// the plugins it runs make their host-side devices, routes and rules;
    /// None: the test process's own.
    netns: Option<PathBuf>,
    /// Extra environment for containerd, which libcni hands on to every
    /// plugin it runs (crash points such as FLATNET_STOP_AFTER).
    env: Vec<(String, String)>,
    /// Sandboxes' network namespaces seen, unmounted on drop if still there.
    netns_seen: Mutex<Vec<PathBuf>>,
}

impl Containerd {
    /// Starts containerd with the CRI plugin on CNI `conf_dir` and
    /// `bin_dir`, imports the test images and waits until CRI reports the
    /// runtime and the network ready.
    pub fn start(conf_dir: &Path, bin_dir: &Path) -> anyhow::Result<Self> {
        Self::start_in(None, conf_dir, bin_dir)
    }

    /// As [`start`](Self::start), with containerd (and so every plugin it
    /// runs) inside the network namespace at `netns`: a node of its own.
    pub fn start_in(netns: Option<&Path>, conf_dir: &Path, bin_dir: &Path) -> anyhow::Result<Self> {
        {
            let mut machine = machine();
            if machine.0 == 0 {
                machine.1 = MACHINE_PATHS
                    .iter()
                    .copied()
                    .filter(|p| !Path::new(p).exists())
                    .collect();
                if !is_mount_point(NETNS_DIR) {
                    // Not a path: the mount, undone when unused.
                    machine.1.insert(0, "mount:/run/netns");
                }
            }
            machine.0 += 1;
        }
        let dir = std::env::temp_dir().join(unique("flatnet-containerd-"));
        // From here on, drop cleans up whatever happens next.
        let mut containerd = Containerd {
            dir,
            process: None,
            netns: netns.map(Path::to_path_buf),
            env: Vec::new(),
            netns_seen: Mutex::new(Vec::new()),
        };
        for sub in ["root", "state", "opt", "logs", "tmp"] {
            std::fs::create_dir_all(containerd.dir.join(sub))
                .with_context(|| format!("creating {}", containerd.dir.display()))?;
        }
        std::fs::write(
            containerd.config_path(),
            containerd.config(conf_dir, bin_dir),
        )
        .context("writing containerd's config")?;
        containerd.spawn()?;
        containerd.import_images()?;
        containerd.wait_ready()?;
        Ok(containerd)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The socket CRI (and containerd's own API) listens on.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// Where pods' log directories go (kubelet's /var/log/pods).
    pub fn log_root(&self) -> PathBuf {
        self.dir.join("logs")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// runc's state (`--root`), under our state dir instead of /run/containerd/runc.
    fn runc_root(&self) -> PathBuf {
        self.state().join("runc")
    }

    fn config(&self, conf_dir: &Path, bin_dir: &Path) -> String {
        ContainerdConfig {
            paths: Some(StatePaths {
                root: self.dir.join("root"),
                state: self.state(),
                socket: self.socket(),
                opt: self.dir.join("opt"),
            }),
            cri: Some(Cri {
                sandbox_image: PAUSE_IMAGE.to_string(),
                cni_bin_dir: bin_dir.to_path_buf(),
                cni_conf_dir: conf_dir.to_path_buf(),
                runc: Some((PathBuf::from(RUNC), self.runc_root())),
                registry_config_path: None,
            }),
        }
        .to_toml()
    }

    /// The environment containerd gets from its next (re)start on.
    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// containerd's pid (None while it is not running).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Child::id)
    }

    /// SIGKILLs containerd and leaves it dead (its sandboxes run on).
    pub fn kill_only(&mut self) {
        self.kill();
    }

    /// Starts containerd again after [`kill_only`](Self::kill_only).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.spawn()?;
        self.wait_ready()
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .context("containerd's log file")?;
        let mut command = Command::new(CONTAINERD);
        command
            .arg("--config")
            .arg(self.config_path())
            .env("TMPDIR", self.dir.join("tmp"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("log file")?)
            .stderr(log);
        if let Some(netns) = &self.netns {
            crate::enter(&mut command, netns)
                .with_context(|| format!("entering {}", netns.display()))?;
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {CONTAINERD}"))?;
        // The socket answering is containerd up; CRI's readiness follows.
        let socket = self.socket();
        let mut exited = None;
        let up = poll_until(Duration::from_secs(30), POLL_INTERVAL, || {
            if let Ok(Some(status)) = child.try_wait() {
                exited = Some(status);
                return true;
            }
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        if let Some(status) = exited {
            bail!("containerd exited ({status}):\n{}", self.log_tail());
        }
        self.process = Some(child);
        if !up {
            bail!(
                "containerd's socket {} did not answer in 30 s:\n{}",
                socket.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// The last lines of containerd's log, for errors.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A CRI client of this containerd.
    pub fn client(&self) -> anyhow::Result<CriClient> {
        Ok(CriClient::connect(&self.socket(), &self.log_root())?
            .with_cgroup_parent(&self.cgroup_parent()))
    }

    /// The sandboxes' cgroup parent: one of this containerd's own, removed
    /// on drop (runc removes a container's cgroup, never its parents).
    pub fn cgroup_parent(&self) -> String {
        format!(
            "/{}",
            self.dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        )
    }

    /// Waits until CRI answers and says RuntimeReady and NetworkReady (the
    /// conflist loaded) and knows the test images.
    fn wait_ready(&self) -> anyhow::Result<()> {
        let mut last = String::from("no answer");
        let ready = poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
            let mut check = || -> anyhow::Result<bool> {
                let client = self.client()?;
                let conditions = client.conditions()?;
                let not_ready: Vec<String> = ["RuntimeReady", "NetworkReady"]
                    .iter()
                    .filter(|c| !conditions.get(**c).is_some_and(|(ok, _)| *ok))
                    .map(|c| format!("{c}: {:?}", conditions.get(*c)))
                    .collect();
                if !not_ready.is_empty() {
                    last = not_ready.join("; ");
                    return Ok(false);
                }
                for image in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
                    if !client.has_image(image)? {
                        last = format!("CRI does not know {image} yet");
                        return Ok(false);
                    }
                }
                Ok(true)
            };
            match check() {
                Ok(ready) => ready,
                Err(e) => {
                    last = format!("{e:#}");
                    false
                }
            }
        });
        if !ready {
            bail!(
                "containerd's CRI was not ready in 30 s ({last}):\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    fn import_images(&self) -> anyhow::Result<()> {
        let archive = TestImages::archive()?;
        let out = Command::new(CTR)
            .arg("--address")
            .arg(self.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&archive)
            .output()
            .context("running ctr images import")?;
        if !out.status.success() {
            bail!(
                "ctr images import {} failed: {}{}",
                archive.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// SIGKILLs containerd and starts it again with the same root, state
    /// and config (as a crashed containerd is restarted): the sandboxes and
    /// their shims keep running meanwhile.
    pub fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Remembers a sandbox's network namespace, to unmount it on drop if
    /// containerd left it.
    pub fn note_netns(&self, path: &Path) {
        // containerd says /var/run/netns/…; mountinfo says /run/netns/….
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Ok(mut seen) = self.netns_seen.lock() {
            seen.push(path);
        }
    }

    /// Stops and removes every sandbox through CRI (CNI DEL runs).
    fn remove_sandboxes(&self) {
        let Ok(client) = self.client() else {
            return;
        };
        let Ok(sandboxes) = client.list_pod_sandbox() else {
            return;
        };
        let ids: Vec<String> = sandboxes.into_iter().map(|(id, _)| id).collect();
        for id in &ids {
            if let Ok(status) = client.pod_sandbox_status(id)
                && let Some(netns) = status.netns
            {
                self.note_netns(&netns);
            }
        }
        for (id, result) in ids.iter().zip(client.stop_and_remove_pod_sandboxes(&ids)) {
            if let Err(e) = result {
                eprintln!("cleanup of sandbox {id} failed: {e:#}");
            }
        }
    }

    /// Shims whose `-address` is our socket: (pid, their socket's path).
    fn our_shims(&self) -> Vec<(i32, PathBuf)> {
        let socket = self.socket().display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let args: Vec<String> = cmdline
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let flag =
                    |name: &str| args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone());
                if !args.first()?.ends_with(SHIM) || flag("-address")? != socket {
                    return None;
                }
                // Where the shim listens (containerd 1.6's SocketAddress):
                // /run/containerd/s/sha256(<address>/<namespace>/<id>).
                let key = format!("{socket}/{}/{}", flag("-namespace")?, flag("-id")?);
                let shim_socket = Path::new(SHIM_SOCKETS).join(hex(&Sha256::digest(key)));
                Some((pid, shim_socket))
            })
            .collect()
    }

    /// Containers runc still has under our runc root, force-deleted.
    fn delete_runc_containers(&self) {
        let Ok(namespaces) = std::fs::read_dir(self.runc_root()) else {
            return;
        };
        for namespace in namespaces.filter_map(Result::ok) {
            let root = namespace.path();
            let Ok(containers) = std::fs::read_dir(&root) else {
                continue;
            };
            for container in containers.filter_map(Result::ok) {
                let _ = Command::new(RUNC)
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force"])
                    .arg(container.file_name())
                    .output();
            }
        }
    }

    /// Unmounts everything mounted under `prefixes`, innermost first.
    fn unmount_under(prefixes: &[PathBuf]) {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut ours: Vec<String> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| prefixes.iter().any(|p| Path::new(m).starts_with(p)))
            .map(str::to_string)
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        ours.dedup();
        for mount in ours {
            let _ = nix::mount::umount2(mount.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.process.is_some() {
            self.remove_sandboxes();
        }
        self.kill();
        // Shims outlive containerd; what they still run goes with runc.
        self.delete_runc_containers();
        for (pid, shim_socket) in self.our_shims() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            // A killed shim leaves its socket.
            let _ = std::fs::remove_file(shim_socket);
        }
        poll_until(Duration::from_secs(5), POLL_INTERVAL, || {
            self.our_shims().is_empty()
        });
        let mut prefixes = vec![self.dir.clone()];
        let netns_seen = self
            .netns_seen
            .lock()
            .map(|seen| seen.clone())
            .unwrap_or_default();
        prefixes.extend(netns_seen.iter().cloned());
        Self::unmount_under(&prefixes);
        if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
            let parent = self.cgroup_parent();
            for hierarchy in hierarchies.filter_map(Result::ok) {
                let _ = std::fs::remove_dir(hierarchy.path().join(parent.trim_start_matches('/')));
            }
        }
        for netns in &netns_seen {
            let _ = std::fs::remove_file(netns);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let mut machine = machine();
        machine.0 = machine.0.saturating_sub(1);
        if machine.0 == 0 {
            // Only when empty: other tools may have put files there since.
            for path in std::mem::take(&mut machine.1) {
                if path == "mount:/run/netns" {
                    let unused = std::fs::read_dir(NETNS_DIR).is_ok_and(|mut d| d.next().is_none());
                    if unused && is_mount_point(NETNS_DIR) {
                        let _ = nix::mount::umount2(NETNS_DIR, nix::mount::MntFlags::MNT_DETACH);
                    }
                } else if path == "/run/containerd/s" {
                    remove_stale_sockets(Path::new(path));
                    let _ = std::fs::remove_dir(path);
                } else if path == "/var/lib/cni/results" {
                    let _ = std::fs::remove_dir_all(path);
                } else {
                    let _ = std::fs::remove_dir(path);
                }
            }
        }
    }
}

/// Removes the sockets in `dir` nobody listens on (those of shims that
/// were killed: a shim removes its own only when it exits cleanly).
fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let refused = matches!(
            std::os::unix::net::UnixStream::connect(&path),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        if refused {
            let _ = std::fs::remove_file(&path);
        }
    }
}

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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

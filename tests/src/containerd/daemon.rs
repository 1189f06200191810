//! [`Containerd`]: one test's containerd, started, restarted and waited
//! on until its CRI is ready.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};

use flatnet_harness::containerd::{ContainerdConfig, Cri, StatePaths};

use super::machine_paths::{MACHINE_PATHS, NETNS_DIR, is_mount_point, machine};
use super::{BUSYBOX_IMAGE, CONTAINERD, CTR, PAUSE_IMAGE, RUNC, TestImages};
use crate::cri::CriClient;
use crate::{POLL_INTERVAL, poll_until, unique};

/// A containerd of one test.
pub struct Containerd {
    pub(super) dir: PathBuf,
    pub(super) process: Option<Child>,
    /// The network namespace containerd runs in (a simulated node's), where
    /// the plugins it runs make their host-side devices, routes and rules;
    /// None: the test process's own.
    netns: Option<PathBuf>,
    /// Extra environment for containerd, which libcni hands on to every
    /// plugin it runs (crash points such as FLATNET_STOP_AFTER).
    env: Vec<(String, String)>,
    /// Sandboxes' network namespaces seen, unmounted on drop if still there.
    pub(super) netns_seen: Mutex<Vec<PathBuf>>,
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
    pub(super) fn runc_root(&self) -> PathBuf {
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

    pub(super) fn kill(&mut self) {
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
}

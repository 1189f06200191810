//! A long-running process of the cluster (etcd, kube-apiserver, kubelet,
//! containerd, ...): started on its machine with its output in a log file
//! of its own, stopped (SIGTERM, then SIGKILL) when dropped, and watched: a
//! daemon that exits while it should run is an error naming its log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::bail;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::host::Host;

pub struct Daemon {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Daemon {
    /// Starts `cmd` (already entered into `host` by [`Host::command`]).
    pub fn start(host: &Host, name: &str, cmd: Command, logs: &Path) -> anyhow::Result<Self> {
        let log = logs.join(format!("{name}.log"));
        let child = host.spawn(cmd, &log)?;
        Ok(Daemon {
            name: name.to_string(),
            log,
            child,
        })
    }

    /// An error when the daemon is no longer running.
    pub fn check(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); the end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// How the daemon ended, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until `ready` holds, failing early when the daemon exits.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        what: &str,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check()?;
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not become ready ({what}) in {timeout:?}; the end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // nsenter passes the signal on to the daemon it runs.
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file, or why there are none: a log that
/// cannot be read or is empty says so instead of printing nothing.
pub fn tail(path: &Path, lines: usize) -> String {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => return format!("(cannot read the log: {e})"),
    };
    if bytes.is_empty() {
        return "(the log is empty)".to_string();
    }
    // Daemons log what they are given (image names, runtime errors): not
    // always UTF-8.
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

//! The e2e build started early, in the background: `cargo xtask test`
//! builds Kubernetes and its runtime from their Go modules (some 20 min of
//! two cores on a cold cache) while the Rust tests run, at the lowest CPU
//! priority, so it takes only what the tests leave idle and a cold run of
//! the suite is not the two one after the other. The e2e part then waits
//! for it; if it failed, the e2e part's own `prepare` builds again in the
//! foreground and says why.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use super::Release;

/// A running `cargo xtask e2e-build`, its output in a log file; killed
/// with its whole process group when dropped before it was waited for.
pub struct BackgroundBuild {
    child: Option<Child>,
    log: PathBuf,
}

impl BackgroundBuild {
    /// Starts the build of `release` unless its binaries are complete.
    /// The Debian packages it needs are installed here first, so the
    /// background never competes for the package manager's lock.
    pub fn start(release: &Release) -> anyhow::Result<Option<Self>> {
        if super::is_complete(release) {
            return Ok(None);
        }
        crate::setup::ensure_packages(super::PACKAGES)?;
        let log =
            std::env::temp_dir().join(format!("flatnet-e2e-build-{}.log", std::process::id()));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let xtask = std::env::current_exe().context("finding xtask's own path")?;
        let child = Command::new("nice")
            .args(["-n", "19"])
            .arg(xtask)
            .args(["e2e-build", "--kubernetes", &release.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own group: the go builds it runs go with it on drop.
            .process_group(0)
            .spawn()
            .context("starting the background e2e build")?;
        println!(
            "e2e-build: Kubernetes {release} building in the background (nice 19) while the tests run; log {}",
            log.display()
        );
        Ok(Some(BackgroundBuild {
            child: Some(child),
            log,
        }))
    }

    /// Waits for it. A failure is reported with the log's end and left to
    /// the foreground `prepare`, which builds again.
    pub fn wait(mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let status = child.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        match status {
            Ok(status) if status.success() => {
                let summary = log.lines().rfind(|l| l.starts_with("e2e-build:"));
                println!("{}", summary.unwrap_or("e2e-build: done in the background"));
            }
            outcome => {
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                println!(
                    "e2e-build in the background failed ({outcome:?}); building in the foreground. Its log ended:\n{}",
                    tail.join("\n")
                );
            }
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

impl Drop for BackgroundBuild {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

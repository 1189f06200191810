//! The e2e build started early, in the background: `cargo xtask test`
//! builds Kubernetes and its runtime from their Go modules (some 20 min of
//! two cores on a cold cache) while the Rust tests run, at the lowest CPU
//! priority, so it takes only what the tests leave idle and a cold run of
//! the suite is not the two one after the other. The e2e part then waits
//! for it, first raising it to normal priority (what is left of it is the
//! suite's critical path; at nice 19 on a busy machine it would get
//! almost nothing); if it failed, the e2e part's own `prepare` builds
//! again in the foreground and says why.

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
        raise_priority(child.id());
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

/// Normal priority (nice 0) for the build's whole process group: the go
/// commands running and those it starts after. A failure only costs time,
/// so it is said and the wait goes on.
fn raise_priority(group: u32) {
    let raised = Command::new("renice")
        .args(["-n", "0", "-g", &group.to_string()])
        .stdout(Stdio::null())
        .status();
    match raised {
        Ok(status) if status.success() => {
            println!("e2e-build: the suite now waits for it; raised to normal priority")
        }
        outcome => {
            println!("e2e-build: cannot raise its priority ({outcome:?}); waiting at nice 19")
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// (process group, nice) of each live process.
    fn groups_and_nice() -> Vec<(u32, i32)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // After the command's ")": state, ppid, pgrp, ... nice is the 17th.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if let (Some(group), Some(nice)) = (fields.get(2), fields.get(16)) {
                found.push((group.parse().unwrap(), nice.parse().unwrap()));
            }
        }
        found
    }

    /// The test's process group, killed however the test ends.
    struct Group(Child);

    impl Drop for Group {
        fn drop(&mut self) {
            let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }

    #[test]
    fn waiting_raises_the_whole_group_to_normal_priority() {
        let test = "waiting_raises_the_whole_group_to_normal_priority";
        if !flatnet_harness::require(
            test,
            flatnet_harness::is_root(),
            "raising a priority needs root",
        ) {
            return;
        }
        let child = Command::new("nice")
            .args(["-n", "19", "sh", "-c", "sleep 30 & sleep 30"])
            .process_group(0)
            .spawn()
            .unwrap();
        let group = Group(child);
        let id = group.0.id();
        let members = move || groups_and_nice().into_iter().filter(move |(g, _)| *g == id);
        let started = std::time::Instant::now();
        while members().count() < 2 {
            assert!(
                started.elapsed().as_secs() < 10,
                "the group never had its two processes"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(members().all(|(_, nice)| nice == 19));
        raise_priority(id);
        let after: Vec<i32> = members().map(|(_, nice)| nice).collect();
        assert!(
            after.len() >= 2 && after.iter().all(|n| *n == 0),
            "{after:?}"
        );
        drop(group);
    }
}

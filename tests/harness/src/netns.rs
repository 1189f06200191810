//! Network namespaces: named ones (`ip netns add`) that are deleted on
//! drop, and entering one from a thread or from a command about to run.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sched::{CloneFlags, setns};

use crate::command::{CommandError, output, run_ok};

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
    /// Deleted should a signal end the process (`crate::remove_on_signal`).
    listed: Option<crate::Listed>,
}

impl Netns {
    /// The namespace `name`; one of that name an interrupted run left
    /// behind is replaced.
    pub fn named(name: &str) -> Result<Self, CommandError> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        Self::add(name)
    }

    /// A namespace of a name no other is using: `prefix` and
    /// [`crate::unique`]'s suffix.
    pub fn unique(prefix: &str) -> Result<Self, CommandError> {
        Self::add(&crate::unique(prefix))
    }

    /// A test's namespace (`ftest-…`); panics when it cannot be made.
    #[track_caller]
    pub fn new() -> Self {
        Self::unique("ftest-").unwrap_or_else(|e| panic!("{e}"))
    }

    /// The namespace `name`, made by someone else, now this one's to
    /// delete (on drop, or on a signal).
    pub fn adopt(name: &str) -> Self {
        let owned = name.to_string();
        let listed = crate::made_here(move || delete(&owned));
        Netns {
            name: name.to_string(),
            listed: Some(listed),
        }
    }

    fn add(name: &str) -> Result<Self, CommandError> {
        output(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Self::adopt(name);
        // Loopback up, as a runtime would have it.
        output(&mut ns.command(&["ip", "link", "set", "lo", "up"]))?;
        Ok(ns)
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs `f` on a thread that has entered this namespace; a panic in `f`
    /// goes on in the caller.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = File::open(self.path())
            .unwrap_or_else(|e| panic!("open {}: {e}", self.path().display()));
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// `args` as a command run inside the namespace (`ip netns exec`).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(args);
        cmd
    }

    /// Runs a command inside the namespace and returns its stdout; panics
    /// when it fails.
    #[track_caller]
    pub fn exec(&self, args: &[&str]) -> String {
        run_ok(&mut self.command(args))
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete(&self.name);
        if let Some(listed) = self.listed.take() {
            listed.removed();
        }
    }
}

/// Deletes the namespace `name` (nothing when it is gone already).
fn delete(name: &str) {
    let _ = Command::new("ip").args(["netns", "del", name]).output();
}

/// Moves the calling thread into the network namespace at `netns`, for
/// good: call it on a thread of its own.
pub fn enter_thread(netns: &Path) -> std::io::Result<()> {
    let file = File::open(netns)?;
    setns(&file, CloneFlags::CLONE_NEWNET)?;
    Ok(())
}

/// Makes `cmd` run inside the network namespace at `netns`, and only
/// there: its mount namespace (and the bpffs with it) stays the caller's,
/// as for a plugin a runtime on a node starts.
pub fn enter(cmd: &mut Command, netns: &Path) -> std::io::Result<()> {
    let file = File::open(netns)?;
    // SAFETY: between fork and exec the closure only calls setns, which is
    // async-signal-safe, on a file opened before the fork.
    unsafe {
        cmd.pre_exec(move || {
            setns(&file, CloneFlags::CLONE_NEWNET)?;
            Ok(())
        });
    }
    Ok(())
}

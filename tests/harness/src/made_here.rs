//! What this process made that would outlive it, kept for a signal to take
//! back: named network namespaces, bpffs mounts and test networks, listed as
//! they are made and struck off as `Drop` removes them, so that a signal that
//! ends the process (SIGINT, SIGTERM, SIGHUP: `Drop` does not run) still takes
//! them all back: [`remove_on_signal`]. A bench killed by `timeout` used to
//! leave its namespaces, mounts and agents behind.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How to take back one thing made here, by the number it was listed
/// under. Run twice on a signal (see `remove_everything_made`), so it must
/// do no harm when the thing is gone already.
type Undo = Box<dyn Fn() + Send>;

static MADE: Mutex<BTreeMap<u64, Undo>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

fn made() -> std::sync::MutexGuard<'static, BTreeMap<u64, Undo>> {
    MADE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Something made here, listed with how to take it back should a signal
/// end the process; struck off with [`Listed::removed`] once `Drop` has
/// taken it back itself.
#[must_use = "strike it off once removed, or a signal removes it twice"]
#[derive(Debug)]
pub struct Listed(u64);

impl Listed {
    pub fn removed(self) {
        made().remove(&self.0);
    }
}

/// Lists something made here with `undo`, which takes it back (and does
/// nothing when it is gone already).
pub fn made_here(undo: impl Fn() + Send + 'static) -> Listed {
    let number = NEXT.fetch_add(1, Ordering::Relaxed);
    made().insert(number, Box::new(undo));
    Listed(number)
}

/// A mount at `mount` in the directory `dir` made for it: unmounted and
/// the directory removed.
pub fn mount_made(mount: &Path, dir: &Path) -> Listed {
    let (mount, dir) = (mount.to_path_buf(), dir.to_path_buf());
    made_here(move || {
        let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&dir);
    })
}

/// From now on SIGINT, SIGTERM and SIGHUP end the process only after what
/// it made is removed (namespaces, mounts, networks: whatever was listed
/// with [`made_here`]) and its child processes (agents, servers, anything
/// they started) are stopped. The exit status is 128 + the signal, as a
/// shell reports a process the signal killed.
pub fn remove_on_signal() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    // While this runs, the rest of the process sees its namespaces and
    // children go and may panic; unwinding, a `Drop` that panics again
    // aborts the process halfway through, and skips the `atexit` handlers
    // (the tests put the host's forwarding switches back in one). A thread
    // that panics then waits for the exit instead.
    let unwind = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if REMOVING.load(Ordering::SeqCst) {
            loop {
                std::thread::park();
            }
        }
        unwind(info);
    }));
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            REMOVING.store(true, Ordering::SeqCst);
            eprintln!("signal {signal}: removing what this process made");
            remove_everything_made();
            std::process::exit(128 + signal);
        }
    });
    Ok(())
}

/// A signal came: what this process made is being removed.
static REMOVING: AtomicBool = AtomicBool::new(false);

fn remove_everything_made() {
    // The newest first, as `Drop` takes them back: a pod's namespace
    // before its network, a node's before its cluster's bpffs. Before the
    // children are stopped: the rest of the process notices stopped
    // children and may fail, and abort, while this thread still works; a
    // deleted name's namespace lives on with its processes, and goes with
    // the last of them.
    let mut listed = std::mem::take(&mut *made());
    for undo in listed.values().rev() {
        undo();
    }
    stop_descendants();
    // Again once the children are gone: a plugin or an agent still running
    // may have written a file again (a network's lock), and the rest of
    // the process may have listed something new meanwhile.
    listed.append(&mut made());
    for undo in listed.values().rev() {
        undo();
    }
}

/// Every process descended from this one ended (and with the last of them
/// the namespaces they held): all asked at once (SIGTERM: a bench binary
/// under `cargo xtask bench` then removes what it made itself while its
/// agents stop), killed (SIGKILL) if still there after 15 s.
fn stop_descendants() {
    let descendants = descendants_of(std::process::id(), &parents());
    let all_gone = || descendants.iter().all(|pid| !running(*pid));
    for (signal, patience) in [(Signal::SIGTERM, 15), (Signal::SIGKILL, 2)] {
        for pid in &descendants {
            let _ = kill(Pid::from_raw(*pid as i32), signal);
        }
        if crate::poll_until(
            Duration::from_secs(patience),
            Duration::from_millis(20),
            all_gone,
        ) {
            return;
        }
    }
}

/// Whether `pid` is still running: there, and no zombie (a child of this
/// process stays one until it is waited for, which no one may do now).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| state_in_stat(&stat))
        .is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

/// The state letter in a `/proc/<pid>/stat` line (after the command name).
fn state_in_stat(stat: &str) -> Option<char> {
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().next()?.chars().next()
}

/// Each live process's parent, from `/proc/<pid>/stat`.
fn parents() -> BTreeMap<u32, u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            Some((pid, parent_in_stat(&stat)?))
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: the second field after the
/// command name, which is in parentheses and may hold spaces and ')'.
fn parent_in_stat(stat: &str) -> Option<u32> {
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// `root`'s descendants in `parents` (not `root` itself), children first
/// found first.
fn descendants_of(root: u32, parents: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (&pid, _) in parents.iter().filter(|&(_, &p)| p == parent) {
            if pid != root && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_after_a_command_name_with_spaces_and_parens() {
        assert_eq!(
            parent_in_stat("4242 (a b) c)) S 17 4242 4242 0 -1"),
            Some(17)
        );
        assert_eq!(
            state_in_stat("4242 (a b) c)) S 17 4242 4242 0 -1"),
            Some('S')
        );
        assert_eq!(parent_in_stat("garbage"), None);
    }

    #[test]
    fn descendants_are_children_and_theirs_not_the_root_or_strangers() {
        let parents = BTreeMap::from([(10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)]);
        let mut found = descendants_of(10, &parents);
        found.sort_unstable();
        assert_eq!(found, [11, 12, 13]);
        assert!(descendants_of(12, &parents).is_empty());
    }

    #[test]
    fn what_is_struck_off_is_not_taken_back() {
        let kept = made_here(|| {});
        let struck = made_here(|| {});
        let (kept_number, struck_number) = (kept.0, struck.0);
        struck.removed();
        assert!(made().contains_key(&kept_number));
        assert!(!made().contains_key(&struck_number));
        kept.removed();
    }
}

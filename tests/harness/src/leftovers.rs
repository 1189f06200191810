//! Removing what a run killed outright left on the node, object by object
//! as [`crate::NodeObjects`] lists them. SIGKILL (or a machine's session
//! ending) gives a run no chance to clean up after itself; the next run
//! does it from the list of what is new since the killed one began.

use std::path::Path;
use std::time::Duration;

/// The order objects go in: processes first (they hold namespaces,
/// mounts and cgroups), then the mounts in scratch folders, cgroups,
/// namespaces, links, pins, run state, and the folders last.
const REMOVAL_ORDER: &[&str] = &[
    "process ",
    "mount ",
    "/sys/fs/cgroup/",
    "/run/netns/",
    "/sys/class/net/",
    "/sys/fs/bpf/",
    "/run/flatnet/",
    "/tmp/",
];

/// `objects` in the order they can be removed in.
pub fn in_removal_order(objects: &[String]) -> Vec<String> {
    let rank = |object: &String| {
        REMOVAL_ORDER
            .iter()
            .position(|kind| object.starts_with(kind))
            .unwrap_or(REMOVAL_ORDER.len())
    };
    let mut ordered = objects.to_vec();
    // Deeper paths first: a pin folder's own pins before it.
    ordered.sort_by_key(|object| (rank(object), std::cmp::Reverse(object.len())));
    ordered
}

/// Removes one object a [`crate::NodeObjects`] listing named; what is gone
/// already is no error.
pub fn remove_object(object: &str) -> Result<(), String> {
    if let Some(cmdline) = object.strip_prefix("process ") {
        kill_processes_running(cmdline);
        return Ok(());
    }
    if let Some(line) = object.strip_prefix("mount ") {
        let mount_point = line.split(' ').nth(1).unwrap_or_default();
        return match nix::mount::umount2(mount_point, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
            Err(e) => Err(format!("unmounting {mount_point}: {e}")),
        };
    }
    let path = Path::new(object);
    if !path.exists() {
        return Ok(());
    }
    let gone = if object.starts_with("/sys/fs/cgroup/") {
        kill_and_remove_cgroup(path);
        Ok(())
    } else if let Some(name) = object.strip_prefix("/run/netns/") {
        ip(&["netns", "delete", name])
    } else if let Some(name) = object.strip_prefix("/sys/class/net/") {
        ip(&["link", "delete", name])
    } else if path.is_dir() {
        std::fs::remove_dir_all(path).map_err(|e| e.to_string())
    } else {
        std::fs::remove_file(path).map_err(|e| e.to_string())
    };
    gone.map_err(|e| format!("removing {object}: {e}"))
}

/// The cgroup at `dir` emptied (`cgroup.kill`: SIGKILL to every process
/// in it and its children; a cgroup with processes cannot be removed) and
/// removed with the cgroups below it.
pub fn kill_and_remove_cgroup(dir: &Path) {
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    crate::poll_until(Duration::from_secs(2), crate::POLL_INTERVAL, || {
        std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|procs| procs.trim().is_empty())
    });
    let children: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| entry.path())
        .collect();
    for child in children {
        kill_and_remove_cgroup(&child);
    }
    let _ = std::fs::remove_dir(dir);
}

fn ip(args: &[&str]) -> Result<(), String> {
    crate::output(std::process::Command::new("ip").args(args))
        .map(drop)
        .map_err(|e| e.to_string())
}

/// SIGKILL to every process whose command line is `cmdline` (as
/// [`crate::NodeObjects`] writes it: arguments joined by spaces), but this
/// process, those that started it (a run of the same binary), and its
/// children (between fork and exec, a child's command line is its
/// parent's).
fn kill_processes_running(cmdline: &str) {
    let spared = this_process_and_its_parents();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if spared.contains(&pid) || parent_of(pid) == Some(spared[0]) {
            continue;
        }
        let Ok(running) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&running)
            .replace('\0', " ")
            .trim_end()
            == cmdline
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn this_process_and_its_parents() -> Vec<i32> {
    let mut chain = vec![std::process::id() as i32];
    while let Some(parent) = parent_of(chain[chain.len() - 1]).filter(|_| chain.len() < 64) {
        chain.push(parent);
    }
    chain
}

/// The parent of `pid` (none for the first process).
fn parent_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        // The second field after the command's closing paren.
        .and_then(|stat| {
            stat.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .filter(|parent: &i32| *parent > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_go_before_what_they_hold_and_pins_before_their_folder() {
        let listed = [
            "/tmp/flatnet-cluster-1",
            "/sys/fs/bpf/flatnet",
            "/run/netns/ftest-1",
            "/sys/fs/bpf/flatnet/net-1",
            "mount bpf /tmp/flatnet-cluster-1/bpf bpf rw 0 0",
            "process /target/debug/flatnet-agent --node cp-1",
            "/sys/fs/cgroup/unified/flatnet-test-1",
        ]
        .map(String::from);
        assert_eq!(
            in_removal_order(&listed),
            [
                "process /target/debug/flatnet-agent --node cp-1",
                "mount bpf /tmp/flatnet-cluster-1/bpf bpf rw 0 0",
                "/sys/fs/cgroup/unified/flatnet-test-1",
                "/run/netns/ftest-1",
                "/sys/fs/bpf/flatnet/net-1",
                "/sys/fs/bpf/flatnet",
                "/tmp/flatnet-cluster-1",
            ]
        );
    }

    /// Not by running the kill on this binary's own command line: that
    /// once killed another test's child between its fork and its exec.
    #[test]
    fn this_process_and_its_parents_are_found() {
        let spared = this_process_and_its_parents();
        assert_eq!(spared[0], std::process::id() as i32);
        assert_eq!(spared[1], std::os::unix::process::parent_id() as i32);
        assert_eq!(parent_of(spared[0]), Some(spared[1]));
    }

    #[test]
    fn what_is_gone_already_is_no_error() {
        for object in [
            "/run/netns/ftest-never-made",
            "/tmp/flatnet-never-made",
            "mount bpf /tmp/flatnet-never-made/bpf bpf rw 0 0",
            "process /nowhere/flatnet-never-run",
        ] {
            assert_eq!(remove_object(object), Ok(()), "{object}");
        }
    }
}

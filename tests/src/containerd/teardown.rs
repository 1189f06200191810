//! What dropping a [`Containerd`] takes away: its sandboxes, shims, runc
//! containers, mounts, cgroups and directories.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::machine_paths::{NETNS_DIR, is_mount_point, machine, remove_stale_sockets};
use super::{Containerd, RUNC, SHIM, SHIM_SOCKETS, hex};
use crate::{POLL_INTERVAL, poll_until};

impl Containerd {
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

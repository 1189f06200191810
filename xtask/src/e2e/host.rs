//! A simulated machine of the cluster: a network namespace, a mount
//! namespace and a UTS namespace (hostname = the machine's name), held open
//! by a holder process. Every daemon of the machine runs entered into all
//! three, so it sees what it would on a machine of its own:
//!
//! - its own directories at the standard paths (`/var/lib/kubelet`,
//!   `/etc/cni/net.d`, `/run`, ...): bind mounts of a per-machine folder,
//!   so two kubelets do not delete each other's pod logs and two
//!   containerds do not share a socket;
//! - a sysfs of its own network namespace (`/sys/class/net` lists its own
//!   devices) with the host's cgroup hierarchies bound back under it, and
//!   no bpffs until something on the machine mounts one (a fresh node);
//! - mounts shared inside the machine (a pod's `Bidirectional` volume
//!   propagates to the machine) and never back to the host (slave).
//!
//! Shutting a machine down kills every process in its mount namespace (the
//! daemons, containerd's shims, the containers), which is what makes a
//! crashed run's leftovers findable too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::util::output;

/// Paths each machine has for itself. The mount point is made on the host
/// when missing (and removed again at teardown when it was made here).
pub const PRIVATE_PATHS: &[&str] = &[
    "/run",
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/etc/containerd",
    "/etc/kubernetes",
    "/var/lib/cni",
    "/var/lib/containerd",
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
];

/// containerd's store: a tmpfs of its own on each machine, at most this big.
const CONTAINER_STORE: &str = "/var/lib/containerd";
const CONTAINER_STORE_SIZE: &str = "6g";

pub struct Host {
    pub name: String,
    /// This machine's folder: `root/<path>` is bound at each private path.
    pub dir: PathBuf,
    holder: Option<Child>,
    holder_pid: u32,
}

impl Host {
    /// Makes the namespaces and the private mounts; `logs` is where the
    /// daemons' output goes.
    pub fn create(name: &str, dir: &Path) -> anyhow::Result<Self> {
        let netns = PathBuf::from("/run/netns").join(name);
        if !netns.exists() {
            run(Command::new("ip").args(["netns", "add", name]))?;
        }
        std::fs::create_dir_all(dir.join("root"))
            .with_context(|| format!("creating {}", dir.display()))?;
        // The holder: entered into the network namespace, it unshares a
        // mount namespace (slave of the host's: nothing mounted inside
        // reaches the host) and a UTS namespace, then sleeps until killed.
        let holder = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args([
                "--",
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "slave",
                "--",
                "sleep",
                "infinity",
            ])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the holder of a machine's namespaces (nsenter, unshare)")?;
        let holder_pid = holder.id();
        let mut host = Host {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            holder: Some(holder),
            holder_pid: 0,
        };
        // nsenter and unshare exec into each other: the pid stays, but the
        // namespaces change only once unshare has run. Wait for that.
        let own_mnt = std::fs::read_link("/proc/self/ns/mnt")?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let exe = std::fs::read_link(format!("/proc/{holder_pid}/exe")).unwrap_or_default();
            let mnt = std::fs::read_link(format!("/proc/{holder_pid}/ns/mnt")).unwrap_or_default();
            if exe.ends_with("sleep") && mnt != own_mnt {
                break;
            }
            if std::time::Instant::now() > deadline {
                bail!("{name}'s namespace holder did not start (pid {holder_pid})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        host.holder_pid = holder_pid;
        host.set_up_mounts()?;
        Ok(host)
    }

    pub fn pid(&self) -> u32 {
        self.holder_pid
    }

    /// The identity of this machine's mount namespace (`mnt:[inode]`).
    pub fn mount_namespace(&self) -> anyhow::Result<PathBuf> {
        Ok(std::fs::read_link(format!(
            "/proc/{}/ns/mnt",
            self.holder_pid
        ))?)
    }

    /// `program` entered into this machine's namespaces.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &self.holder_pid.to_string(),
            "--mount",
            "--uts",
            "--net",
            "--",
        ])
        .arg(program);
        cmd
    }

    /// Runs a short command on the machine and returns its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.command(program);
        cmd.args(args);
        Ok(output(&mut cmd)?)
    }

    /// Starts a daemon on the machine, its output appended to `log`.
    pub fn spawn(&self, mut cmd: Command, log: &Path) -> anyhow::Result<Child> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        cmd.spawn()
            .with_context(|| format!("starting {}", flatnet_harness::describe(&cmd)))
    }

    fn set_up_mounts(&self) -> anyhow::Result<()> {
        let sh = |script: &str| -> anyhow::Result<()> {
            self.run("sh", &["-euc", script])
                .with_context(|| format!("setting up {}'s mounts", self.name))?;
            Ok(())
        };
        run(Command::new("nsenter")
            .args([
                "--target",
                &self.holder_pid.to_string(),
                "--uts",
                "hostname",
            ])
            .arg(&self.name))?;
        // A sysfs of the machine's network namespace, with the host's
        // cgroup hierarchies (one tree for all machines: kubelet's
        // cgroupRoot keeps each node's apart) moved back under it. Done
        // while every mount is still a slave: a mount under a shared one
        // cannot be moved.
        let cgroup_move = self.dir.join("cgroup-move");
        std::fs::create_dir_all(&cgroup_move)?;
        sh(&format!(
            "mount --rbind /sys/fs/cgroup '{dir}'
             mount -t sysfs sysfs /sys
             mount --move '{dir}' /sys/fs/cgroup",
            dir = cgroup_move.display()
        ))?;
        // Shared inside the machine, still a slave of the host.
        sh("mount --make-rshared /")?;
        for path in PRIVATE_PATHS {
            let source = self.dir.join("root").join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&source)?;
            if !Path::new(path).exists() {
                std::fs::create_dir_all(path)
                    .with_context(|| format!("creating the mount point {path}"))?;
                // Remembered so teardown takes it away again.
                let made = self.dir.join("made-mount-points");
                let mut list = std::fs::read_to_string(&made).unwrap_or_default();
                list.push_str(path);
                list.push('\n');
                std::fs::write(&made, list)?;
            }
            if *path == CONTAINER_STORE {
                // Images and their unpacked layers (1-2 GB a machine) in
                // memory, not on a disk the build has nearly filled: a CI
                // run once ran out of space importing an image. Gone with
                // the machine's mount namespace.
                sh(&format!(
                    "mount -t tmpfs -o size={CONTAINER_STORE_SIZE},mode=0711 tmpfs {path}"
                ))?;
            } else {
                sh(&format!("mount --bind '{}' '{path}'", source.display()))?;
            }
        }
        // /run is the machine's own: make what the tools expect there.
        sh("mkdir -p /run/netns /run/lock")?;
        Ok(())
    }

    /// The paths mounted on the host for this machine that were not there before.
    fn made_mount_points(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("made-mount-points"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Kills every process of the machine (all that share its mount
    /// namespace), removes its network namespace and its folder's state.
    pub fn shut_down(&mut self) {
        if self.holder.is_none() {
            return;
        }
        // containerd's shims unshare a mount namespace of their own: they
        // are found by the machine's network namespace, which they keep.
        let net = std::fs::read_link(format!("/proc/{}/ns/net", self.holder_pid)).ok();
        if let Ok(mnt) = self.mount_namespace() {
            kill_mount_namespace(&mnt);
        }
        if let Some(net) = net {
            kill_namespace_members("net", &net);
        }
        if let Some(mut holder) = self.holder.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
        remove_made_mount_points(&self.dir);
    }
}

/// Removes the mount points a machine made on the host (listed in its
/// folder), when they are empty: never anything that is not ours, and
/// never one another machine still has something mounted on (removing a
/// directory detaches the mounts on it in every other mount namespace: an
/// e2e cluster going down took critest's containerd store from under it).
pub fn remove_made_mount_points(dir: &Path) {
    let in_use = mount_points_in_use();
    for path in Host::made_mount_points(dir) {
        if !in_use.contains(Path::new(&path)) {
            let _ = std::fs::remove_dir(&path);
        }
    }
}

/// Every mount point of every mount namespace but this process's own.
fn mount_points_in_use() -> std::collections::BTreeSet<PathBuf> {
    let own = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::BTreeSet::new();
    let mut points = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let proc_dir = entry.path();
        let Ok(ns) = std::fs::read_link(proc_dir.join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) == own.as_ref() || !seen.insert(ns) {
            continue;
        }
        let Ok(mountinfo) = std::fs::read_to_string(proc_dir.join("mountinfo")) else {
            continue;
        };
        points.extend(mount_points(&mountinfo));
    }
    points
}

/// The mount points (5th field) of a `mountinfo` file.
fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(PathBuf::from)
}

impl Drop for Host {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// SIGKILLs every process whose mount namespace is `mnt`, until none is left.
pub fn kill_mount_namespace(mnt: &Path) {
    kill_namespace_members("mnt", mnt);
}

/// SIGKILLs every process whose `kind` namespace (`mnt`, `net`) is `ns`,
/// until none is left.
pub fn kill_namespace_members(kind: &str, ns: &Path) {
    for _ in 0..50 {
        let mut found = false;
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|p| p.parse::<i32>().ok())
                else {
                    continue;
                };
                if std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
                    .ok()
                    .as_deref()
                    == Some(ns)
                {
                    found = true;
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    output(cmd)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_the_fifth_field() {
        let mountinfo = "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw\n\
                         40 36 0:34 / /var/lib/containerd rw shared:2 - tmpfs tmpfs rw\n";
        let points: Vec<PathBuf> = mount_points(mountinfo).collect();
        assert_eq!(
            points,
            [
                PathBuf::from("/mnt/parent"),
                PathBuf::from("/var/lib/containerd")
            ]
        );
    }
}

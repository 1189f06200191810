//! Taking the critest machine away by name: what a killed run left, or
//! this run's machine on a signal (`Drop` does not run then).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::super::host;
use super::names::{NAME, SOCKET, STATE_DIR};

/// The `k8s.io` folder of every cgroup hierarchy.
pub(super) fn k8s_cgroups() -> Vec<PathBuf> {
    super::super::cgroups::cgroup_hierarchies()
        .unwrap_or_default()
        .into_iter()
        .map(|h| h.join("k8s.io"))
        .collect()
}

/// What a machine of an earlier (killed) run left, or this one's on a
/// signal: its sandboxes removed through CRI while its containerd still
/// answers, then its processes, network namespace, folder and cgroups.
pub fn clean_up(crictl: &Path) {
    let netns = Path::new("/run/netns").join(NAME);
    if !netns.exists() {
        let _ = std::fs::remove_dir_all(STATE_DIR);
        return;
    }
    println!(
        "critest: taking down {NAME} by name (left by an earlier run, or this one on a signal)"
    );
    let inode = nix::sys::stat::stat(&netns).map(|s| s.st_ino).unwrap_or(0);
    let net = PathBuf::from(format!("net:[{inode}]"));
    // Any process of the machine (the namespace holder is one) lets
    // crictl in through nsenter.
    let member = members("net", &net).into_iter().next();
    if let Some(pid) = member {
        let _ = Command::new("timeout")
            .args([
                "90",
                "nsenter",
                "--target",
                &pid.to_string(),
                "--mount",
                "--uts",
                "--net",
                "--",
            ])
            .arg(crictl)
            .args([
                "--runtime-endpoint",
                &format!("unix://{SOCKET}"),
                "rmp",
                "--all",
                "--force",
            ])
            .output();
        if let Ok(mnt) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) {
            host::kill_mount_namespace(&mnt);
        }
    }
    host::kill_namespace_members("net", &net);
    let _ = Command::new("ip").args(["netns", "delete", NAME]).output();
    host::remove_made_mount_points(&Path::new(STATE_DIR).join(NAME));
    remove_state(&[]);
}

/// Pids whose `kind` namespace is `ns`.
fn members(kind: &str, ns: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
                .ok()
                .as_deref()
                == Some(ns)
        })
        .collect()
}

/// The cgroups of the machine's containers (named by the runc state it
/// kept), the `k8s.io` folders this run made, and the state folder.
pub(super) fn remove_state(made_cgroups: &[PathBuf]) {
    let runc = Path::new(STATE_DIR)
        .join(NAME)
        .join("root/run/containerd/runc/k8s.io");
    let ids: Vec<String> = std::fs::read_dir(&runc)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for parent in k8s_cgroups() {
        for id in &ids {
            let _ = std::fs::remove_dir(parent.join(id));
        }
    }
    for made in made_cgroups {
        let _ = std::fs::remove_dir(made);
    }
    let _ = std::fs::remove_dir_all(STATE_DIR);
}

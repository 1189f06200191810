//! The cluster's machines in the host's cgroup tree: each node's kubelet
//! has a cgroupRoot of its own (`/fe2e-node-1`, ...) in every hierarchy;
//! what a cluster leaves there (processes, BPF links of its agents) is
//! found, killed and detached here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::plan;

/// Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers and
/// the v2 `unified` one of a hybrid layout, or the v2 root alone).
pub fn cgroup_hierarchies() -> anyhow::Result<Vec<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            let fs_type = fields.get(dash + 1)?;
            (*fs_type == "cgroup" || *fs_type == "cgroup2").then(|| PathBuf::from(fields[4]))
        })
        .filter(|p| p.starts_with("/sys/fs/cgroup"))
        .collect())
}

/// Removes `root` and everything under it from every hierarchy, deepest
/// first (a cgroup is removed with rmdir once it is empty of processes):
/// what is still in it is killed first (the pods' containers outlive
/// kubelet and containerd, reparented to init, and a kept cgroup is
/// reused by the next cluster, with whatever was attached to it).
pub fn remove_cgroup_tree(root: &str) {
    let Ok(hierarchies) = cgroup_hierarchies() else {
        return;
    };
    for _ in 0..50 {
        let left = processes_in(&hierarchies, root);
        if left.is_empty() {
            break;
        }
        for pid in left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for hierarchy in hierarchies {
        let top = hierarchy.join(root.trim_start_matches('/'));
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            detach_bpf_links(&dir);
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// Detaches the BPF links attached to cgroup `dir` (the agents' Service
/// socket programs): an interrupted run's outlive it, and when the cgroup
/// is not removed (a process left in it) the next cluster reusing its
/// name runs them first, with the dead cluster's maps (a ClusterIP sent
/// to a backend that no longer exists).
fn detach_bpf_links(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let Ok(out) = std::process::Command::new("bpftool")
        .args(["-j", "link", "show"])
        .output()
    else {
        return;
    };
    for id in cgroup_link_ids(&String::from_utf8_lossy(&out.stdout), meta.ino()) {
        println!("e2e: detaching BPF link {id} left on {}", dir.display());
        let _ = std::process::Command::new("bpftool")
            .args(["link", "detach", "id", &id.to_string()])
            .output();
    }
}

/// The links of `bpftool -j link show` attached to the cgroup whose id (its
/// directory's inode on cgroup2) is `cgroup_id`.
fn cgroup_link_ids(links_json: &str, cgroup_id: u64) -> Vec<u64> {
    let Ok(serde_json::Value::Array(links)) = serde_json::from_str(links_json) else {
        return Vec::new();
    };
    links
        .iter()
        .filter(|link| link["type"] == "cgroup" && link["cgroup_id"] == cgroup_id)
        .filter_map(|link| link["id"].as_u64())
        .collect()
}

/// The processes in cgroup `root` or under it, in any of `hierarchies`.
fn processes_in(hierarchies: &[PathBuf], root: &str) -> std::collections::BTreeSet<i32> {
    let mut dirs = Vec::new();
    for hierarchy in hierarchies {
        collect_dirs(&hierarchy.join(root.trim_start_matches('/')), &mut dirs);
    }
    dirs.iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// What a cluster left behind on this machine (the leak check after each):
/// processes still in a machine's cgroup tree, BPF links still attached to
/// a machine's cgroup.
pub fn leftovers() -> Vec<String> {
    let Ok(hierarchies) = cgroup_hierarchies() else {
        return Vec::new();
    };
    let mut left = Vec::new();
    let links = std::process::Command::new("bpftool")
        .args(["-j", "link", "show"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    for hierarchy in &hierarchies {
        for root in machine_cgroups(hierarchy) {
            let entry = hierarchy.join(root.trim_start_matches('/'));
            let pids = processes_in(std::slice::from_ref(hierarchy), &root);
            if !pids.is_empty() {
                left.push(format!("processes {pids:?} in {}", entry.display()));
            }
            use std::os::unix::fs::MetadataExt;
            if let Ok(meta) = entry.metadata()
                && !cgroup_link_ids(&links, meta.ino()).is_empty()
            {
                left.push(format!("BPF links on {}", entry.display()));
            }
        }
    }
    left
}

/// The machines' top cgroups in `hierarchy` ("/fe2e-node-1", ...).
pub fn machine_cgroups(hierarchy: &Path) -> Vec<String> {
    let prefix = format!("{}-", plan::PREFIX);
    std::fs::read_dir(hierarchy)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&prefix))
        .map(|name| format!("/{name}"))
        .collect()
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    out.push(dir.to_path_buf());
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_links_of_the_cgroup_are_named() {
        let links = r#"[{"id":7,"type":"cgroup","prog_id":1,"cgroup_id":6903},
            {"id":8,"type":"cgroup","prog_id":2,"cgroup_id":0},
            {"id":9,"type":"tcx","prog_id":3},
            {"id":10,"type":"cgroup","prog_id":4,"cgroup_id":6903}]"#;
        assert_eq!(cgroup_link_ids(links, 6903), [7, 10]);
        assert!(cgroup_link_ids(links, 1).is_empty());
        assert!(cgroup_link_ids("not json", 6903).is_empty());
    }
}

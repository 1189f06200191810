//! The private node the hostile cases run against: a network namespace
//! and a mount namespace with its own bpffs, a plugin called inside it
//! with a case's environment, and snapshots of everything a call could
//! change.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flatnet_tests::*;

/// A node of its own: netns + mount namespace with a private bpffs.
pub(super) struct PrivateNode {
    /// The node's network namespace (deleted on drop, after the holder).
    _netns: Netns,
    holder: Child,
}

impl PrivateNode {
    pub(super) fn new() -> Self {
        let netns = Netns::new();
        // `ip netns exec` gives the command a mount namespace of its own
        // (slave to the host's, /sys remounted for the netns); the bpffs
        // mounted there is this node's only.
        let holder = Command::new("ip")
            .args(["netns", "exec", &netns.name, "sh", "-c"])
            .arg("mount -t bpf bpf /sys/fs/bpf && exec sleep 3600")
            .stdin(Stdio::null())
            .spawn()
            .expect("start the node's holder process");
        let node = PrivateNode {
            _netns: netns,
            holder,
        };
        wait_until("the private bpffs", Duration::from_secs(10), || {
            node.sh("stat -f -c %T /sys/fs/bpf").trim() == "bpf_fs"
        });
        node
    }

    /// A command run inside the node (its netns and mount namespace).
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &self.holder.id().to_string(),
            "--mount",
            "--net",
            "--",
        ])
        .arg(program);
        cmd
    }

    fn sh(&self, script: &str) -> String {
        let out = self
            .command(Path::new("/bin/sh"))
            .args(["-c", script])
            .output()
            .expect("nsenter");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// A snapshot once the kernel is done with a new pod's veth (IPv6
/// link-local address, duplicate address detection): two in a row, 1 s
/// apart, alike.
pub(super) fn settled_snapshot(node: &PrivateNode, net: &Network) -> String {
    let mut last: Option<String> = None;
    let settled = poll_until(Duration::from_secs(15), Duration::from_secs(1), || {
        let now = snapshot(node, net);
        // DAD keeps a new link-local address "tentative" for a second or two.
        let alike = last.as_ref() == Some(&now) && !now.contains("tentative");
        last = Some(now);
        alike
    });
    assert!(
        settled,
        "the node never settled: the snapshot before the calls would be a moving target"
    );
    last.expect("a snapshot")
}

/// Everything of the node a plugin call could change.
pub(super) fn snapshot(node: &PrivateNode, net: &Network) -> String {
    let pins = format!("/sys/fs/bpf/flatnet/{}", net.name.replace('.', "~"));
    let script = format!(
        r#"
echo '## links'; ip -o link
echo '## addresses'; ip -o addr
echo '## routes'; ip route show table all; ip -6 route show table all
echo '## neighbours'; ip neigh show nud permanent
echo '## qdiscs'; tc qdisc show
echo '## filters'; for dev in $(ls /sys/class/net); do tc filter show dev $dev ingress; tc filter show dev $dev egress; done
echo '## tcx and xdp programs'; bpftool net show
echo '## xdp'; ip -o link show | grep -o 'prog/xdp id [0-9]*'
echo '## nftables'; nft list ruleset 2>&1
echo '## pins'; find /sys/fs/bpf | sort
echo '## endpoints'; bpftool -j map dump pinned {pins}/ENDPOINTS_V4 2>&1
echo '## endpoints v6'; bpftool -j map dump pinned {pins}/ENDPOINTS_V6 2>&1
echo '## host veths'; bpftool -j map dump pinned {pins}/HOST_VETHS 2>&1
"#
    );
    let mut text = node.sh(&script);
    text.push_str("## ipam data dir\n");
    text.push_str(&dir_listing(&net.ipam_dir));
    text
}

fn dir_listing(dir: &Path) -> String {
    let mut lines = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path.clone());
                lines.push(format!("{}/", path.display()));
            } else {
                let content = std::fs::read(&path).unwrap_or_default();
                lines.push(format!(
                    "{} {}",
                    path.display(),
                    String::from_utf8_lossy(&content)
                ));
            }
        }
    }
    lines.sort();
    lines.join("\n")
}

pub(super) fn base_env(target_netns: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", "ADD".into()),
        ("CNI_CONTAINERID", "hostile-ctr".into()),
        ("CNI_NETNS", target_netns.display().to_string()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_PATH", cni_path()),
    ]
}

pub(super) fn invoke(
    node: &PrivateNode,
    plugin: &Path,
    env: &[(&'static str, Option<String>)],
    stdin: &[u8],
) -> CniOutput {
    let mut cmd = node.command(plugin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (key, value) in env {
        if let Some(value) = value {
            cmd.env(key, value);
        }
    }
    run_with_stdin(&mut cmd, stdin)
}

pub(super) fn env_for(
    base: &[(&'static str, String)],
    changes: &[(&'static str, Option<String>)],
) -> Vec<(&'static str, Option<String>)> {
    let mut env: Vec<(&'static str, Option<String>)> =
        base.iter().map(|(k, v)| (*k, Some(v.clone()))).collect();
    for (key, value) in changes {
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.clone(),
            None => env.push((key, value.clone())),
        }
    }
    env
}

pub(super) fn first_difference(before: &str, after: &str) -> String {
    let (b, a): (Vec<_>, Vec<_>) = (before.lines().collect(), after.lines().collect());
    for line in &a {
        if !b.contains(line) {
            return format!("appeared: {line}");
        }
    }
    for line in &b {
        if !a.contains(line) {
            return format!("vanished: {line}");
        }
    }
    "line order changed".into()
}

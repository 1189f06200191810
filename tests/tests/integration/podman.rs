//! A real runtime: podman (CNI backend, libcni inside) starts two busybox
//! containers on a flatnet network with flatnet-ipam; they reach each other
//! over TCP through the eBPF redirect; `podman rm` leaves nothing behind.
//!
//! The machine's podman configuration is not touched: a temporary
//! containers.conf (CONTAINERS_CONF) points podman at our plugins and a
//! temporary network directory, and storage lives under a temporary
//! --root/--runroot; all of it, and the few machine paths podman creates on
//! first use, are removed on drop. The image is built offline from
//! busybox-static.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use flatnet_tests::*;
use serde_json::Value;

/// Paths podman creates on the machine whatever its configuration says
/// (blob cache, libcni's result cache, runc's state root): removed again
/// when the test made them.
const MACHINE_PATHS: &[&str] = &[
    "/var/lib/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/runc",
    "/run/containers",
    "/run/libpod",
];

/// podman, runc and busybox, with the packages that bring them.
const PODMAN_TOOLS: &[(&str, &str)] = &[
    ("/usr/bin/podman", "podman"),
    ("/usr/sbin/runc", "runc"),
    ("/bin/busybox", "busybox-static"),
];

/// A podman that only this test uses.
struct Podman {
    dir: PathBuf,
    /// Machine paths that did not exist before.
    absent_before: Vec<&'static str>,
}

impl Podman {
    fn new(network: &str, conflist: &Value) -> Self {
        let absent_before = MACHINE_PATHS
            .iter()
            .copied()
            .filter(|p| !Path::new(p).exists())
            .collect();
        let dir = std::env::temp_dir().join(unique("flatnet-podman-"));
        for sub in ["net", "root", "runroot", "tmp", "rootfs/bin"] {
            std::fs::create_dir_all(dir.join(sub)).expect("temp dirs");
        }
        let podman = Podman { dir, absent_before };
        std::fs::write(
            podman.dir.join("net").join(format!("{network}.conflist")),
            serde_json::to_string_pretty(conflist).expect("JSON"),
        )
        .expect("write the conflist");
        let d = podman.dir.display();
        // runc (crun fails on this kernel's
        // hybrid cgroups), no default ulimits (the sandbox refuses raising
        // RLIMIT_NOFILE), the CNI backend.
        let conf = format!(
            r#"[containers]
default_ulimits = []

[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}", "/usr/lib/cni"]
network_config_dir = "{d}/net"
default_network = "{network}"

[engine]
runtime = "runc"
tmp_dir = "{d}/tmp"
image_copy_tmp_dir = "{d}/tmp"
events_logger = "file"
events_logfile_path = "{d}/events.log"
cgroup_manager = "cgroupfs"
"#,
            bin = bin_dir().display(),
        );
        std::fs::write(podman.dir.join("containers.conf"), conf).expect("containers.conf");
        podman
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("podman");
        let d = &self.dir;
        cmd.env("CONTAINERS_CONF", d.join("containers.conf"))
            .env("TMPDIR", d.join("tmp"))
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .args(["--storage-driver", "vfs"]);
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run podman")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// busybox-static and its applet links, tarred and imported.
    fn import_busybox(&self, image: &str) {
        let rootfs = self.dir.join("rootfs");
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
        let list = run_ok(Command::new("/bin/busybox").arg("--list"));
        for applet in list.lines().filter(|a| !a.is_empty() && *a != "busybox") {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
                .expect("applet link");
        }
        let tar = self.dir.join("image.tar");
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        self.ok(&["import", &tar.display().to_string(), image]);
    }

    fn inspect(&self, container: &str) -> Value {
        let text = self.ok(&["inspect", container]);
        let all: Value = serde_json::from_str(&text).expect("inspect JSON");
        all[0].clone()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        // Anything podman left mounted under our directory, innermost first.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| m.starts_with(&*self.dir.to_string_lossy()))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in ours {
            let _ = Command::new("umount").args(["-l", mount]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        for path in &self.absent_before {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

fn sha256(text: &str) -> String {
    text.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[flatnet_test(root, tools = PODMAN_TOOLS)]
fn two_podman_containers_talk_through_the_redirect_and_rm_cleans_up() {
    let net = Network::flatnet_ipam();
    let conflist = net.conflist("1.0.0", Vec::new()).list;
    let podman = Podman::new(&net.name, &conflist);
    let image = format!("localhost/{}:1", unique("flatnet-busybox-"));
    podman.import_busybox(&image);

    let (a, b) = (unique("fla-"), unique("flb-"));
    for name in [&a, &b] {
        podman.ok(&[
            "run",
            "--detach",
            "--name",
            name,
            "--runtime",
            "runc",
            "--network",
            &net.name,
            &image,
            "/bin/httpd",
            "-f",
            "-p",
            "8080",
            "-h",
            "/",
        ]);
    }
    let mut ips = Vec::new();
    let mut veths = Vec::new();
    for name in [&a, &b] {
        let info = podman.inspect(name);
        let ip = info["NetworkSettings"]["Networks"][&net.name]["IPAddress"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no address on {}: {info}", net.name))
            .to_string();
        assert!(ip.starts_with(&net.subnet_prefix), "{ip}");
        let id = info["Id"].as_str().expect("container ID");
        // libcni calls the plugin with the container ID and eth0.
        let veth = net.host_veth(id, "eth0");
        assert!(link_exists(&veth), "host veth {veth} of {name}");
        ips.push(ip);
        veths.push(veth);
    }
    let mut held = net.ipam_allocations();
    held.sort();
    let mut expected = ips.clone();
    expected.sort();
    assert_eq!(
        held, expected,
        "flatnet-ipam holds exactly the two addresses"
    );
    assert_eq!(net.datapath().all_endpoints().expect("endpoints").len(), 2);

    // /bin/busybox (~2 MB here) each way over TCP: busybox wget from the other's httpd.
    let want = sha256(&run_ok(Command::new("sha256sum").arg("/bin/busybox")));
    let before = (net.redirected_packets(), net.redirected_bytes());
    for (client, server_ip) in [(&a, &ips[1]), (&b, &ips[0])] {
        let got = podman.ok(&[
            "exec",
            client,
            "sh",
            "-c",
            &format!("wget -q -O - http://{server_ip}:8080/bin/busybox | sha256sum"),
        ]);
        assert_eq!(sha256(&got), want, "{client} fetched from {server_ip}");
    }
    // Segments are GSO-sized on veths: count bytes, not just packets.
    let packets = net.redirected_packets() - before.0;
    let bytes = net.redirected_bytes() - before.1;
    eprintln!("{packets} packets, {bytes} bytes redirected between the two containers");
    let file = std::fs::metadata("/bin/busybox").expect("busybox").len();
    // Two fetches of the file, each in full (plus headers and ACKs).
    assert!(
        bytes > 3 * file / 2,
        "only {bytes} bytes went through the redirect"
    );
    assert!(
        packets > 0,
        "only {packets} packets went through the redirect"
    );

    podman.ok(&["rm", "--force", "--time", "0", &a, &b]);
    for veth in &veths {
        assert!(wait_link_gone(veth, Duration::from_secs(10)), "{veth} left");
    }
    assert!(
        net.ipam_allocations().is_empty(),
        "{:?}",
        net.ipam_allocations()
    );
    assert!(!net.datapath().exists(), "pins (and map entries) left");
    assert!(wait_link_gone(&net.gateway_device, Duration::from_secs(10)));
}

//! The images a real cluster runs, built here and offline: no registry can
//! be reached from this machine, so every image the nodes run (the pod
//! sandbox, the e2e suite's test images, flatnet's agent, the cluster DNS)
//! is a docker-archive tarball written from Debian's binaries and ours, then
//! imported into each node's containerd with `ctr -n k8s.io images import`
//! (docs/kubernetes.md, Real Kubernetes).
//!
//! Three parts:
//! - [`Rootfs`]: what an image holds, as host files copied in (each
//!   dynamically linked ELF with its shared libraries and program
//!   interpreter, found with `ldd`), symlinks, directories and generated
//!   files. Image paths follow Debian's merged /usr: /bin, /sbin, /lib and
//!   /lib64 are symlinks into /usr, and files added under them land there.
//! - [`write_archive`]: a deterministic docker-archive (`manifest.json`, the
//!   config JSON and one uncompressed layer tar; entries sorted, mtime 0,
//!   owner root), so the same inputs always give the same image ID; and
//!   [`cached_archive`], which writes it only when its inputs changed.
//! - The images, one function each ([`pause`], [`agnhost`], [`busybox`], ...),
//!   named exactly as containerd and the e2e suite of Kubernetes 1.37 ask for
//!   them (and by the tags the suite of the release run lists:
//!   `release_names`), most on one shared [`toolbox`] of command-line tools.
//!
//! [`Rootfs`]: rootfs::Rootfs
//! [`write_archive`]: archive::write_archive
//! [`cached_archive`]: archive::cached_archive
//! [`pause`]: test_images::pause
//! [`agnhost`]: test_images::agnhost
//! [`busybox`]: test_images::busybox
//! [`toolbox`]: toolbox::toolbox

mod archive;
mod critest_images;
mod flatnet_images;
mod registry_layout;
mod release_names;
mod rootfs;
mod shared_libraries;
mod spec;
mod test_images;
mod toolbox;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::e2e::build::Built;
use archive::cached_archives;
use flatnet_images::{FlatnetBinaries, cluster_dns, cluster_dns_binary, flatnet};
use test_images::test_images;

// --- Image names ------------------------------------------------------------

/// The sandbox image containerd runs for every pod (its `pinned_images`),
/// and the e2e suite's `imageutils.GetPauseImageName()`.
pub const PAUSE: &str = "registry.k8s.io/pause:3.10.2";
/// The names below are the e2e suite's, from
/// `test/utils/image/manifest.go` of Kubernetes 1.37.2 (the suite asks for
/// the previous agnhost too: the same image under both names).
pub const AGNHOST: &[&str] = &[
    "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
    "registry.k8s.io/e2e-test-images/agnhost:2.55",
];
pub const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
/// The DNS specs' glibc querier (`dig`, `getent` through glibc's
/// resolver), beside agnhost's musl one.
pub const GLIBC_DNS_TESTING: &str = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1";
/// What the DNS specs of 1.35 and earlier ran in its place (upstream:
/// Debian jessie with dnsutils): the same image serves both.
pub const JESSIE_DNSUTILS: &str = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7";
pub const NGINX: &[&str] = &[
    "registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
    "registry.k8s.io/e2e-test-images/nginx:1.28.0-2",
];
/// `[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout`'s host
/// exec pod (`sleep`, `conntrack -L`, `grep`).
pub const DISTROLESS_IPTABLES: &str = "registry.k8s.io/build-image/distroless-iptables:v0.9.9";
/// The invalid-conntrack test's packet injector (built from the same tree).
pub const REGRESSION_74839: &str = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5";
/// The agent's DaemonSet image (xtask/deploy/kubernetes/daemonset.yaml).
pub const FLATNET: &str = "localhost/flatnet:0.1.0";
pub const CLUSTER_DNS: &str = "localhost/flatnet-cluster-dns:0.1.0";

/// Debian's default search path, for every image that has a shell or tools.
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Every image a cluster of `cargo xtask e2e` runs, as archives in the
/// Kubernetes cache's `images/` folder (rebuilt only when their inputs
/// changed): the test images, flatnet's agent from the release (or the
/// debug) build ([`FlatnetBinaries::of_build`]) and the cluster DNS server
/// ([`cluster_dns_binary`], the same build in its image and in agnhost's).
pub fn for_cluster(kube: &Built, release: bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut cluster_dns_binary = cluster_dns_binary(release);
    let mut binaries = FlatnetBinaries::of_build(release)?;
    if !release {
        // A debug build's debug info is 80% of its size (the agent: 280 MB
        // of 345): every node would import it, and the agent's pod would
        // page it in under its memory limit. The code is the same without.
        let dir = crate::util::root().join("target/e2e/debug-stripped");
        cluster_dns_binary = without_debug_info(&cluster_dns_binary, &dir)?;
        binaries = FlatnetBinaries {
            agent: without_debug_info(&binaries.agent, &dir)?,
            plugin: without_debug_info(&binaries.plugin, &dir)?,
            ipam: without_debug_info(&binaries.ipam, &dir)?,
        };
    }
    let mut specs = test_images(kube, &cluster_dns_binary)?;
    specs.push(flatnet(
        &binaries,
        &kube.bin(crate::e2e::build::CNI_PLUGINS_DIR),
    )?);
    specs.push(cluster_dns(&cluster_dns_binary)?);
    cached_archives(&specs, &kube.root.join("images"))
}

/// The images `cargo xtask critest` serves from its registry, as
/// archives in `dir` (rebuilt only when their inputs changed), each with
/// the names it is pushed under; `pause` is the Kubernetes cache's pause
/// program, `work` a folder for what the images compile.
pub fn for_critest(
    pause: &Path,
    work: &Path,
    dir: &Path,
) -> anyhow::Result<Vec<(Vec<String>, PathBuf)>> {
    let specs = critest_images::critest_images(pause, work)?;
    let archives = cached_archives(&specs, dir)?;
    Ok(specs
        .into_iter()
        .map(|spec| spec.names)
        .zip(archives)
        .collect())
}

/// A copy of `binary` in `dir` without its DWARF sections (`objcopy
/// --strip-debug`, binutils); symbols stay, so backtraces still name
/// functions.
fn without_debug_info(binary: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = binary
        .file_name()
        .with_context(|| format!("{} has no file name", binary.display()))?;
    let stripped = dir.join(name);
    crate::util::run_cmd(
        std::process::Command::new("objcopy")
            .arg("--strip-debug")
            .arg(binary)
            .arg(&stripped),
    )
    .with_context(|| format!("stripping {} (install binutils)", binary.display()))?;
    Ok(stripped)
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::archive::import;
    use super::*;
    use crate::util::output;

    /// A fresh folder under the temp dir, removed on drop.
    pub(super) struct TempDir(pub(super) PathBuf);

    impl TempDir {
        pub(super) fn new() -> Self {
            static COUNT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "flatnet-images-test-{}-{}",
                std::process::id(),
                COUNT.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A containerd of this test only (own root, state, socket, runc root
    /// and FIFOs under a temp dir; no CRI), stopped and removed on drop.
    struct PrivateContainerd {
        dir: TempDir,
        process: std::process::Child,
        /// /run/containerd, where shims put their sockets whatever the
        /// config says, when it was absent before.
        made_run_dir: bool,
    }

    impl PrivateContainerd {
        fn start() -> Self {
            let made_run_dir = !Path::new("/run/containerd").exists();
            let dir = TempDir::new();
            let config = flatnet_harness::containerd::ContainerdConfig {
                paths: Some(flatnet_harness::containerd::StatePaths {
                    root: dir.0.join("root"),
                    state: dir.0.join("state"),
                    socket: dir.0.join("containerd.sock"),
                    opt: dir.0.join("opt"),
                }),
                cri: None,
            }
            .to_toml();
            fs::write(dir.0.join("config.toml"), config).unwrap();
            let log = File::create(dir.0.join("containerd.log")).unwrap();
            let process = Command::new("/usr/bin/containerd")
                .arg("--config")
                .arg(dir.0.join("config.toml"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let containerd = PrivateContainerd {
                dir,
                process,
                made_run_dir,
            };
            for _ in 0..300 {
                if std::os::unix::net::UnixStream::connect(containerd.socket()).is_ok() {
                    return containerd;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            panic!(
                "containerd did not answer: {}",
                fs::read_to_string(containerd.dir.0.join("containerd.log")).unwrap_or_default()
            );
        }

        fn socket(&self) -> PathBuf {
            self.dir.0.join("containerd.sock")
        }

        fn ctr(&self) -> Command {
            let mut cmd = Command::new("/usr/bin/ctr");
            cmd.arg("--address")
                .arg(self.socket())
                .args(["--namespace", "k8s.io"]);
            cmd
        }

        /// `ctr run` of `image` in a network namespace of its own (loopback
        /// only: nothing leaves it); stdout and stderr, and the exit code.
        fn run(&self, image: &str, privileged: bool, args: &[&str]) -> (String, Option<i32>) {
            static COUNT: AtomicUsize = AtomicUsize::new(0);
            let id = format!(
                "flatnet-images-check-{}-{}",
                std::process::id(),
                COUNT.fetch_add(1, Ordering::Relaxed)
            );
            let mut cmd = self.ctr();
            cmd.args(["run", "--rm", "--runc-root"])
                .arg(self.dir.0.join("runc"))
                .arg("--fifo-dir")
                .arg(self.dir.0.join("fifo"))
                // One level under the root, which runc removes with the
                // container (a /k8s.io/<id> default would leave /k8s.io).
                .args(["--cgroup", &format!("/{id}")]);
            if privileged {
                cmd.arg("--privileged");
            }
            let out = cmd.arg(image).arg(&id).args(args).output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (text, out.status.code())
        }
    }

    impl Drop for PrivateContainerd {
        fn drop(&mut self) {
            let pid = nix::unistd::Pid::from_raw(self.process.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = self.process.wait();
            let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut ours: Vec<&str> = mounts
                .lines()
                .filter_map(|line| line.split_whitespace().nth(4))
                .filter(|mount| Path::new(mount).starts_with(&self.dir.0))
                .collect();
            ours.sort_by_key(|mount| std::cmp::Reverse(mount.len()));
            for mount in ours {
                let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
            }
            if self.made_run_dir {
                // Only when empty: someone else's shims may be there by now.
                let _ = fs::remove_dir("/run/containerd/s");
                let _ = fs::remove_dir("/run/containerd");
            }
        }
    }

    /// Imports the test images (and flatnet's two when their binaries are
    /// built) into a private containerd and runs what the e2e suite runs in
    /// them. Needs root, containerd and runc, and `cargo xtask e2e-build`'s
    /// cache; archives stay in target/e2e-images-check between runs.
    #[test]
    #[ignore = "root, containerd and the Kubernetes cache: run by hand"]
    fn containerd_runs_the_images() {
        assert!(crate::util::is_root(), "run this test as root");
        let release = super::super::build::DEFAULT_RELEASE.parse().unwrap();
        let kube = super::super::build::prepare(&release).unwrap();
        // Built first by `cargo xtask build --release` and `cargo build
        // --release -p flatnet-cluster-dns`; missing ones fail the check.
        let cluster_dns_binary = cluster_dns_binary(true);
        let mut specs = test_images(&kube, &cluster_dns_binary).unwrap();
        let flatnet_binaries = FlatnetBinaries::of_build(true).unwrap();
        specs.push(
            flatnet(
                &flatnet_binaries,
                &kube.bin(crate::e2e::build::CNI_PLUGINS_DIR),
            )
            .unwrap(),
        );
        specs.push(cluster_dns(&cluster_dns_binary).unwrap());
        let archives =
            cached_archives(&specs, &crate::util::root().join("target/e2e-images-check")).unwrap();

        let containerd = PrivateContainerd::start();
        for archive in &archives {
            import(archive, Path::new("/usr/bin/ctr"), &containerd.socket()).unwrap();
        }
        let listed = output(containerd.ctr().args(["images", "ls", "-q"])).unwrap();
        for spec in &specs {
            for name in &spec.names {
                assert!(
                    listed.lines().any(|l| l == name),
                    "{name} not imported: {listed}"
                );
            }
        }

        // (image, privileged, command, what its output must contain)
        let mut checks: Vec<(&str, bool, Vec<&str>, &str)> = vec![
            // /bin/sh is dash, and runs PATH's tools, not busybox's applets.
            (
                BUSYBOX,
                false,
                vec!["sh", "-c", "readlink /proc/$$/exe"],
                "/usr/bin/dash",
            ),
            (BUSYBOX, false, vec!["/bin/sh", "-c", "echo ok"], "ok"),
            (
                BUSYBOX,
                false,
                vec!["/bin/sh", "-c", "nc -h 2>&1 | head -n 1"],
                "OpenBSD netcat",
            ),
            (
                BUSYBOX,
                false,
                vec![
                    "sh",
                    "-c",
                    "nc -u -l -W 1 127.0.0.1 9999 & sleep 1; echo hostName | nc -w 1 -u 127.0.0.1 9999; wait",
                ],
                "hostName",
            ),
            (BUSYBOX, false, vec!["curl", "--version"], "curl 7.88"),
            (BUSYBOX, false, vec!["wget", "--version"], "GNU Wget"),
            (
                BUSYBOX,
                false,
                vec![
                    "sh",
                    "-c",
                    "wget -q -T 1 -O - http://127.0.0.1:1/; echo rc=$?",
                ],
                "rc=4",
            ),
            (AGNHOST[0], false, vec!["dig", "-v"], "DiG 9.18"),
            (
                AGNHOST[0],
                false,
                vec!["nslookup", "-version"],
                "nslookup 9.18",
            ),
            (AGNHOST[0], false, vec!["host", "-V"], "host 9.18"),
            (
                AGNHOST[0],
                false,
                vec![
                    "sh",
                    "-c",
                    "echo \"10.9.8.7 $(hostname)\" >> /etc/hosts; hostname -i; getent hosts $(hostname -s)",
                ],
                "10.9.8.7\n10.9.8.7",
            ),
            (
                BUSYBOX,
                false,
                vec![
                    "sh",
                    "-c",
                    "for i in $(seq 1 3); do echo -n $i; done; timeout 1 sleep 5; echo \" rc=$?\"",
                ],
                "123 rc=",
            ),
            (BUSYBOX, false, vec!["ip", "-V"], "iproute2"),
            (BUSYBOX, false, vec!["ss", "-ant46"], "State"),
            // The storage utils' HostExec: nsenter into PID 1's mount
            // namespace (here the container's own), then `sh -c`.
            (
                AGNHOST[0],
                true,
                vec![
                    "nsenter",
                    "--mount=/proc/1/ns/mnt",
                    "--",
                    "sh",
                    "-c",
                    "echo entered",
                ],
                "entered",
            ),
            (AGNHOST[0], false, vec!["/agnhost", "--help"], "netexec"),
            // The CoreDNS stand-in ("DNS should support configurable pod
            // resolv.conf"): runs, reads the Corefile it is given.
            (
                AGNHOST[0],
                false,
                vec![
                    "sh",
                    "-c",
                    "/coredns -conf /nonexistent 2>&1; echo \"exit=$?\"",
                ],
                "cannot read the Corefile /nonexistent: No such file or directory (os error 2)\nexit=1",
            ),
            (
                AGNHOST[0],
                false,
                vec![
                    "sh",
                    "-c",
                    "/agnhost netexec --http-port=8080 --udp-port=8081 >/dev/null 2>&1 & sleep 2; \
                     curl -g -q -s 'http://127.0.0.1:8080/dial?request=hostname&protocol=udp&host=127.0.0.1&port=8081&tries=1'",
                ],
                "{\"responses\":[",
            ),
            (
                NGINX[0],
                false,
                vec![
                    "sh",
                    "-c",
                    "nginx -g 'daemon off;' & sleep 1; wget -q -T 2 -O - http://127.0.0.1/",
                ],
                "Welcome to nginx!",
            ),
            (
                DISTROLESS_IPTABLES,
                true,
                vec![
                    "sh",
                    "-c",
                    "iptables -A INPUT -p tcp --dport 80 -j ACCEPT && iptables-save | grep dport && conntrack -L",
                ],
                "--dport 80",
            ),
        ];
        checks.extend([
            (
                FLATNET,
                false,
                vec!["/usr/local/bin/flatnet", "--version"],
                "flatnet",
            ),
            (
                FLATNET,
                false,
                vec!["/usr/local/bin/flatnet-agent", "--help"],
                "Usage",
            ),
            (FLATNET, false, vec!["nft", "--version"], "nftables v1"),
            (FLATNET, false, vec!["iptables", "--version"], "(nf_tables)"),
            (
                FLATNET,
                true,
                vec![
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "POSTROUTING",
                    "-p",
                    "udp",
                    "-j",
                    "MASQUERADE",
                ],
                "",
            ),
            (
                FLATNET,
                false,
                vec!["/usr/lib/cni/portmap"],
                "CNI portmap plugin",
            ),
            (FLATNET, false, vec!["ip", "-V"], "iproute2"),
        ]);
        checks.push((
            CLUSTER_DNS,
            false,
            vec!["/usr/local/bin/flatnet-cluster-dns", "--help"],
            "Usage",
        ));
        let mut failed = Vec::new();
        for (image, privileged, args, expected) in &checks {
            let (said, code) = containerd.run(image, *privileged, args);
            let ok = said.contains(expected);
            println!(
                "{} {image} {args:?} (exit {code:?}):\n{}",
                if ok { "ok" } else { "FAILED" },
                said.trim_end()
            );
            if !ok {
                failed.push(format!("{image} {args:?}"));
            }
        }
        // The sandbox: PID 1 of its own PID namespace, exits on SIGTERM.
        let started = std::time::Instant::now();
        let mut pause = containerd.ctr();
        pause
            .args(["run", "--rm", "--runc-root"])
            .arg(containerd.dir.0.join("runc"))
            .arg("--fifo-dir")
            .arg(containerd.dir.0.join("fifo"))
            .args([
                "--cgroup",
                &format!("/flatnet-images-check-pause-{}", std::process::id()),
            ])
            .args([
                PAUSE,
                &format!("flatnet-images-check-pause-{}", std::process::id()),
            ]);
        let mut child = pause.spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
        assert!(
            child.try_wait().unwrap().is_none(),
            "pause exited by itself"
        );
        output(containerd.ctr().args([
            "task",
            "kill",
            "--signal",
            "SIGTERM",
            &format!("flatnet-images-check-pause-{}", std::process::id()),
        ]))
        .unwrap();
        let status = child.wait().unwrap();
        println!(
            "ok {PAUSE}: ran, exited on SIGTERM with {status} after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        assert!(status.success(), "pause exited with {status}");
        assert!(failed.is_empty(), "failed: {failed:#?}");
    }
}

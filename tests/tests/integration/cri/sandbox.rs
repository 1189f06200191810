//! A sandbox as the CRI tests know it, run and checked on a node (ready,
//! on flatnet's host veth, cleaned up after Stop and Remove), and what is
//! done with it: an httpd in it, a fetch from a container, a thread in its
//! network namespace.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use flatnet_tests::containerd::BUSYBOX_IMAGE;
use flatnet_tests::cri::{CriClient, PodSpec, SandboxStatus};
use flatnet_tests::*;
use k8s_cri::v1::PodSandboxState;

use super::node::Node;

/// A sandbox as the tests know it.
pub(super) struct Sandbox {
    pub(super) id: String,
    pub(super) status: SandboxStatus,
    pub(super) netns: PathBuf,
    pub(super) host_veth: String,
}

impl Sandbox {
    pub(super) fn ip(&self) -> IpAddr {
        self.status.ip.parse().expect("the sandbox's IP")
    }

    pub(super) fn ips(&self) -> Vec<IpAddr> {
        std::iter::once(&self.status.ip)
            .chain(&self.status.additional_ips)
            .map(|ip| ip.parse().expect("an IP"))
            .collect()
    }

    /// Global addresses on eth0 inside the sandbox's netns.
    pub(super) fn addresses_inside(&self) -> Vec<IpAddr> {
        let mut cmd = Command::new("ip");
        cmd.args(["-o", "addr", "show", "dev", "eth0", "scope", "global"]);
        enter(&mut cmd, &self.netns).expect("enter the sandbox's netns");
        run_ok(&mut cmd)
            .lines()
            .filter_map(|line| line.split_whitespace().nth(3))
            .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
            .collect()
    }
}

/// Runs `f` on a thread in the network namespace at `netns`.
pub(super) fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter_thread(netns).expect("enter the netns");
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// An HTTP GET of `path` from `server`, made from the current thread.
pub(super) fn http_get(server: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let mut conn = TcpStream::connect_timeout(&server, Duration::from_secs(5))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response)?;
    Ok(response)
}

fn sha256_of(text: &[u8]) -> String {
    String::from_utf8_lossy(text)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// From a container, fetches /bin/busybox from `server`'s httpd and checks
/// its digest; ExecSync as `kubectl exec` runs it.
pub(super) fn fetch_busybox(client: &CriClient, container: &str, server: IpAddr) {
    let want = sha256_of(run_ok(Command::new("sha256sum").arg("/bin/busybox")).as_bytes());
    let url = match server {
        IpAddr::V4(ip) => format!("http://{ip}:8080/bin/busybox"),
        IpAddr::V6(ip) => format!("http://[{ip}]:8080/bin/busybox"),
    };
    let (code, stdout, stderr) = client
        .exec_sync(
            container,
            &["sh", "-c", &format!("wget -q -O - {url} | sha256sum")],
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        code,
        0,
        "wget {url} in {container}: {}",
        String::from_utf8_lossy(&stderr)
    );
    assert_eq!(sha256_of(&stdout), want, "{container} fetched from {url}");
}

pub(super) fn assert_no_sandboxes(client: &CriClient) {
    let left = client.list_pod_sandbox().expect("ListPodSandbox");
    assert!(left.is_empty(), "sandboxes left: {left:?}");
}

pub(super) fn stop_and_remove(client: &CriClient, sandbox: &Sandbox) {
    client
        .stop_pod_sandbox(&sandbox.id)
        .unwrap_or_else(|e| panic!("{e:#}"));
    client
        .remove_pod_sandbox(&sandbox.id)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

impl Node {
    /// RunPodSandbox, its status, and the checks every sandbox must pass:
    /// ready, on flatnet's host veth, its netns known.
    pub(super) fn run_sandbox(&self, client: &CriClient, name: &str) -> Sandbox {
        self.run_pod(client, &PodSpec::new(name))
    }

    /// [`run_sandbox`](Self::run_sandbox) of a pod with port mappings or
    /// annotations.
    pub(super) fn run_pod(&self, client: &CriClient, pod: &PodSpec) -> Sandbox {
        let id = client
            .run_pod_sandbox(pod)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()));
        self.sandbox(client, id)
    }

    pub(super) fn sandbox(&self, client: &CriClient, id: String) -> Sandbox {
        let status = client
            .pod_sandbox_status(&id)
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(status.state, PodSandboxState::SandboxReady, "{status:?}");
        let netns = status
            .netns
            .clone()
            .unwrap_or_else(|| panic!("no netns in the verbose status of {id}: {status:?}"));
        self.containerd().note_netns(&netns);
        let host_veth = self.host_veth(&id);
        assert!(self.has_link(&host_veth), "host veth {host_veth} of {id}");
        Sandbox {
            id,
            status,
            netns,
            host_veth,
        }
    }

    /// Stop and Remove left nothing of `gone` (veth, endpoint entries,
    /// addresses), and with no sandbox left, no pins or gateway device.
    pub(super) fn assert_cleaned_up(&self, gone: &[Sandbox], none_left: bool) {
        for sandbox in gone {
            assert!(
                self.wait_link_gone(&sandbox.host_veth, Duration::from_secs(10)),
                "host veth {} of {} left",
                sandbox.host_veth,
                sandbox.id
            );
            assert!(
                !sandbox.netns.exists(),
                "netns {} of {} left",
                sandbox.netns.display(),
                sandbox.id
            );
        }
        let held: HashSet<IpAddr> = self.allocations().into_iter().collect();
        for sandbox in gone {
            for ip in sandbox.ips() {
                assert!(
                    !held.contains(&ip),
                    "{ip} of {} still allocated",
                    sandbox.id
                );
                if self.datapath().exists() {
                    assert!(
                        self.datapath().endpoint(ip).expect("endpoint").is_none(),
                        "endpoint {ip} of {} left in the datapath",
                        sandbox.id
                    );
                }
            }
        }
        if none_left {
            assert!(held.is_empty(), "addresses left: {held:?}");
            assert!(
                !self.datapath().exists(),
                "pins left in {}",
                self.datapath().pin_dir().display()
            );
            assert!(
                self.wait_link_gone(&self.bridge, Duration::from_secs(10)),
                "gateway device {} left",
                self.bridge
            );
        }
    }

    /// A busybox httpd serving the container's / on :8080 in the sandbox.
    pub(super) fn start_httpd(&self, client: &CriClient, sandbox: &Sandbox) -> String {
        client
            .create_and_start_container(
                &sandbox.id,
                "httpd",
                BUSYBOX_IMAGE,
                &["/bin/httpd", "-f", "-p", "8080", "-h", "/"],
            )
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()))
    }
}

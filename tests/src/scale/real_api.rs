//! A real kube-apiserver and its etcd (the release `cargo xtask
//! e2e-build` built) in the simulated node's network namespace, on
//! 127.0.0.1 there, as the scale harness's API server: the agent reaches
//! it as on a node, with a kubeconfig. Nothing else of a control plane
//! runs (no controllers: the harness writes Pods with their status and
//! EndpointSlices itself, as the kubelets and the EndpointSlice
//! controller would). Two users with static tokens, so the audit log
//! tells the agent's requests from the harness's writes. etcd keeps its
//! data on a tmpfs of its own; all of it goes on drop, or on a signal.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use super::churn::Write;
use super::writer;
use crate::{Listed, Netns, enter, mount_made, poll_until, unique};

pub const PORT: u16 = 6443;
/// The users the token file names.
pub const AGENT_USER: &str = "flatnet-agent";
const HARNESS_USER: &str = "flatnet-scale";

/// The API server, its etcd, and the thread that writes to it.
pub struct RealApi {
    dir: PathBuf,
    /// The agent's kubeconfig (its token, the server's own CA).
    pub agent_kubeconfig: PathBuf,
    children: Vec<Child>,
    jobs: Option<mpsc::Sender<writer::Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    listed: Option<Listed>,
}

fn spawn_logged(mut cmd: Command, netns: &Netns, log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log)?;
    enter(&mut cmd, &netns.path())?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("{:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{:?}: {}", cmd, String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn kubeconfig(path: &Path, ca: &Path, token: &str) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: scale\n  cluster:\n    server: https://127.0.0.1:{PORT}\n    certificate-authority: {}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: scale\n  context: {{cluster: scale, user: user}}\ncurrent-context: scale\n",
        ca.display()
    );
    std::fs::write(path, text)?;
    Ok(())
}

impl RealApi {
    /// Starts etcd and kube-apiserver from `bin` (a folder with both) in
    /// `netns`, advertised at `address` (the node's: a node namespace has
    /// no default route to find one by), and waits for it to be ready.
    pub fn start(bin: &Path, netns: &Netns, address: IpAddr) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(unique("flatnet-scale-api-"));
        std::fs::create_dir_all(&dir)?;
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=12g,mode=0700"),
        )
        .context("a tmpfs for etcd")?;
        let listed = Some(mount_made(&dir, &dir));
        let mut api = RealApi {
            agent_kubeconfig: dir.join("agent.kubeconfig"),
            dir,
            children: Vec::new(),
            jobs: None,
            thread: None,
            listed,
        };
        api.start_in(bin, netns, address)?;
        Ok(api)
    }

    fn start_in(&mut self, bin: &Path, netns: &Netns, address: IpAddr) -> anyhow::Result<()> {
        let dir = self.dir.clone();
        run(Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
            ])
            .arg(dir.join("sa.key")))?;
        run(Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(dir.join("sa.key"))
            .arg("-out")
            .arg(dir.join("sa.pub")))?;
        let (agent_token, harness_token) = (unique("agent-"), unique("harness-"));
        let mut tokens = std::fs::File::create(dir.join("tokens.csv"))?;
        writeln!(tokens, "{agent_token},{AGENT_USER},uid-agent")?;
        writeln!(tokens, "{harness_token},{HARNESS_USER},uid-harness")?;
        std::fs::write(
            dir.join("audit.yaml"),
            format!(
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [{AGENT_USER}]\n- level: None\n"
            ),
        )?;

        let mut etcd = Command::new(bin.join("etcd"));
        etcd.arg(format!("--data-dir={}", dir.join("etcd").display()))
            .args([
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                // The largest cluster's objects and their history.
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ]);
        self.children
            .push(spawn_logged(etcd, netns, &dir.join("etcd.log"))?);

        let mut apiserver = Command::new(bin.join("kube-apiserver"));
        apiserver
            .args([
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=127.0.0.1",
                &format!("--secure-port={PORT}"),
                "--service-cluster-ip-range=10.96.0.0/12",
                "--authorization-mode=AlwaysAllow",
                "--anonymous-auth=false",
                // No controllers: no service account for pods to name.
                "--disable-admission-plugins=ServiceAccount",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--profiling=false",
                "--v=0",
            ])
            .arg(format!("--advertise-address={address}"))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!(
                "--token-auth-file={}",
                dir.join("tokens.csv").display()
            ))
            .arg(format!(
                "--service-account-key-file={}",
                dir.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                dir.join("sa.key").display()
            ))
            .arg(format!(
                "--audit-policy-file={}",
                dir.join("audit.yaml").display()
            ))
            .arg(format!(
                "--audit-log-path={}",
                dir.join("audit.log").display()
            ));
        self.children
            .push(spawn_logged(apiserver, netns, &dir.join("apiserver.log"))?);
        // Anonymous requests are refused: the check shows the harness's token.
        let bearer = format!("Authorization: Bearer {harness_token}");
        let ready = poll_until(Duration::from_secs(120), Duration::from_millis(500), || {
            netns
                .command(&[
                    "curl",
                    "-sk",
                    "-H",
                    &bearer,
                    &format!("https://127.0.0.1:{PORT}/readyz"),
                ])
                .output()
                .is_ok_and(|out| out.stdout == b"ok")
        });
        if !ready {
            bail!(
                "kube-apiserver not ready after 120 s:\n{}",
                tail(&dir.join("apiserver.log"))
            );
        }
        let ca = dir.join("certs").join("apiserver.crt");
        kubeconfig(&self.agent_kubeconfig, &ca, &agent_token)?;
        let harness_kubeconfig = dir.join("harness.kubeconfig");
        kubeconfig(&harness_kubeconfig, &ca, &harness_token)?;
        let (jobs, receiver) = mpsc::channel();
        let netns_path = netns.path();
        self.thread = Some(std::thread::spawn(move || {
            writer::serve(&netns_path, &harness_kubeconfig, receiver)
        }));
        self.jobs = Some(jobs);
        Ok(())
    }

    /// Makes `writes`, up to `concurrency` at once; the first error, if
    /// any, once all are done.
    pub fn write(&self, writes: Vec<Write>, concurrency: usize) -> anyhow::Result<()> {
        let (done, result) = mpsc::channel();
        self.jobs
            .as_ref()
            .context("the writer is gone")?
            .send(writer::Job {
                writes,
                concurrency,
                done,
            })
            .map_err(|_| anyhow::anyhow!("the writer stopped"))?;
        result
            .recv()
            .map_err(|_| anyhow::anyhow!("the writer stopped"))?
            .map_err(|e| anyhow::anyhow!(e))
    }

    /// The agent's requests so far: lists, watches, and every verb's
    /// count (`get`, `create`, ...: writes would show there), from the
    /// audit log.
    pub fn agent_requests(&self) -> Value {
        let log = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        let mut verbs = serde_json::Map::new();
        for line in log.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            // A watch is counted as it starts (it completes only when it
            // ends), any other request as it completes.
            let counted = if event["verb"] == "watch" {
                "ResponseStarted"
            } else {
                "ResponseComplete"
            };
            if event["stage"] != counted {
                continue;
            }
            let verb = event["verb"].as_str().unwrap_or("?").to_string();
            let count = verbs.entry(verb).or_insert(Value::from(0));
            *count = Value::from(count.as_u64().unwrap_or(0) + 1);
        }
        let of = |verb: &str| verbs.get(verb).cloned().unwrap_or(Value::from(0));
        serde_json::json!({"lists": of("list"), "watches": of("watch"), "verbs": verbs})
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl Drop for RealApi {
    fn drop(&mut self) {
        // The writer first (its channel closes), then the servers.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(listed) = self.listed.take() {
            listed.removed();
        }
    }
}

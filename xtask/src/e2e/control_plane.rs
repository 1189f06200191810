//! The control plane machine: etcd, kube-apiserver, kube-controller-manager
//! and kube-scheduler, as kubeadm would run them (secure ports, RBAC and
//! Node authorization, service account tokens, node CIDRs allocated by the
//! controller manager). It also holds the cluster's switch: a bridge that
//! every node's uplink is plugged into, and the routes back to the pods.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use super::daemon::Daemon;
use super::host::Host;
use super::pki::{Credential, Pki, Subject};
use super::plan::{self, Plan};

/// Audited: flatnet's agents and the cluster DNS, at the Metadata level
/// (who asked what, and the API server's annotations such as
/// `k8s.io/deprecated`); nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users:
  - system:serviceaccount:kube-system:flatnet-agent
  - system:serviceaccount:kube-system:flatnet-cluster-dns
- level: None
";

/// The API server's audit log of flatnet's requests.
pub fn audit_log(plan: &Plan) -> PathBuf {
    plan.logs.join("audit.log")
}

pub struct ControlPlane {
    pub host: Host,
    pub admin_kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    daemons: Vec<Daemon>,
}

impl ControlPlane {
    /// Starts everything and waits for the API server to be ready.
    pub fn start(plan: &Plan, pki: &Pki, bin: &Path, etcd: &Path) -> anyhow::Result<Self> {
        let host = Host::create(&plan.control_plane_name(), &plan.dir.join("control-plane"))?;
        set_up_switch(&host, plan)?;
        let credentials = Credentials::issue(plan, pki)?;
        let mut control_plane = ControlPlane {
            kubectl: bin.join("kubectl"),
            admin_kubeconfig: credentials.admin_kubeconfig.clone(),
            daemons: Vec::new(),
            host,
        };
        control_plane.start_etcd(etcd, &plan.logs)?;
        control_plane.start_apiserver(plan, pki, bin, &credentials)?;
        control_plane.start_controller_manager(plan, pki, bin, &credentials)?;
        control_plane.start_scheduler(plan, bin, &credentials)?;
        control_plane.wait_for_default_service_account()?;
        Ok(control_plane)
    }

    /// etcd, on the tmpfs `set_up_switch` mounted, once its client port
    /// answers.
    fn start_etcd(&mut self, etcd: &Path, logs: &Path) -> anyhow::Result<()> {
        let mut etcd_cmd = self.host.command(etcd);
        etcd_cmd.args([
            "--name=control-plane",
            "--data-dir=/var/lib/etcd",
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=control-plane=http://127.0.0.1:2380",
            "--log-level=warn",
        ]);
        let mut etcd_daemon = Daemon::start(&self.host, "etcd", etcd_cmd, logs)?;
        etcd_daemon.wait_ready(Duration::from_secs(30), "client port", || {
            self.host
                .run("curl", &["-sf", "http://127.0.0.1:2379/health"])
                .is_ok()
        })?;
        self.daemons.push(etcd_daemon);

        Ok(())
    }

    /// kube-apiserver, once it answers /readyz.
    fn start_apiserver(
        &mut self,
        plan: &Plan,
        pki: &Pki,
        bin: &Path,
        credentials: &Credentials,
    ) -> anyhow::Result<()> {
        let address = IpAddr::V4(plan::CONTROL_PLANE_ADDRESS);
        let Credentials {
            serving,
            kubelet_client,
            ..
        } = credentials;
        // Every request of flatnet's agents and the cluster DNS is audited
        // (metadata only), so a deprecated API they use is found by its
        // audit annotation (suites.rs reads it).
        let audit_policy = plan.dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY)
            .with_context(|| format!("writing {}", audit_policy.display()))?;
        let mut apiserver = self.host.command(bin.join("kube-apiserver"));
        apiserver
            .arg(format!("--audit-policy-file={}", audit_policy.display()))
            .arg(format!("--audit-log-path={}", audit_log(plan).display()))
            .arg(format!("--advertise-address={address}"))
            .arg("--bind-address=0.0.0.0")
            .arg(format!("--secure-port={}", plan::API_PORT))
            .arg("--etcd-servers=http://127.0.0.1:2379")
            .arg(format!(
                "--service-cluster-ip-range={}",
                plan.service_cidrs()
            ))
            .arg("--service-node-port-range=30000-32767")
            .arg("--allow-privileged=true")
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            .arg(format!("--tls-cert-file={}", serving.cert.display()))
            .arg(format!("--tls-private-key-file={}", serving.key.display()))
            .arg(format!(
                "--kubelet-client-certificate={}",
                kubelet_client.cert.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                kubelet_client.key.display()
            ))
            .arg(format!(
                "--kubelet-certificate-authority={}",
                pki.ca_cert.display()
            ))
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg(format!(
                "--service-account-key-file={}",
                pki.service_account_pub.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key.display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg("--api-audiences=https://kubernetes.default.svc.cluster.local")
            .arg("--endpoint-reconciler-type=lease")
            .arg("--profiling=false")
            .arg("--v=1");
        let mut apiserver_daemon =
            Daemon::start(&self.host, "kube-apiserver", apiserver, &plan.logs)?;
        apiserver_daemon.wait_ready(Duration::from_secs(90), "/readyz", || {
            self.kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|out| out.trim() == "ok")
        })?;
        self.daemons.push(apiserver_daemon);

        Ok(())
    }

    /// kube-controller-manager, which allocates the nodes' pod CIDRs.
    fn start_controller_manager(
        &mut self,
        plan: &Plan,
        pki: &Pki,
        bin: &Path,
        credentials: &Credentials,
    ) -> anyhow::Result<()> {
        let mut controller = self.host.command(bin.join("kube-controller-manager"));
        let kubeconfig = credentials
            .controller_manager_kubeconfig
            .display()
            .to_string();
        controller
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg(format!("--authentication-kubeconfig={kubeconfig}"))
            .arg(format!("--authorization-kubeconfig={kubeconfig}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--leader-elect=false")
            .arg("--allocate-node-cidrs=true")
            .arg(format!("--cluster-cidr={}", plan.cluster_cidrs()))
            .args(node_cidr_mask_flags(plan.dual_stack))
            .arg(format!(
                "--service-cluster-ip-range={}",
                plan.service_cidrs()
            ))
            .arg(format!(
                "--cluster-signing-cert-file={}",
                pki.ca_cert.display()
            ))
            .arg(format!(
                "--cluster-signing-key-file={}",
                pki.ca_key().display()
            ))
            .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
            .arg(format!(
                "--service-account-private-key-file={}",
                pki.service_account_key.display()
            ))
            .arg("--use-service-account-credentials=true")
            .arg("--controllers=*,bootstrapsigner,tokencleaner")
            // No cloud: routes are the CNI's (flatnet's agents).
            .arg("--configure-cloud-routes=false")
            .arg("--profiling=false")
            .arg("--v=1");
        self.daemons.push(Daemon::start(
            &self.host,
            "kube-controller-manager",
            controller,
            &plan.logs,
        )?);

        Ok(())
    }

    /// kube-scheduler.
    fn start_scheduler(
        &mut self,
        plan: &Plan,
        bin: &Path,
        credentials: &Credentials,
    ) -> anyhow::Result<()> {
        let mut scheduler_cmd = self.host.command(bin.join("kube-scheduler"));
        let kubeconfig = credentials.scheduler_kubeconfig.display().to_string();
        scheduler_cmd
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg(format!("--authentication-kubeconfig={kubeconfig}"))
            .arg(format!("--authorization-kubeconfig={kubeconfig}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--leader-elect=false")
            .arg("--profiling=false")
            .arg("--v=1");
        self.daemons.push(Daemon::start(
            &self.host,
            "kube-scheduler",
            scheduler_cmd,
            &plan.logs,
        )?);
        Ok(())
    }

    fn wait_for_default_service_account(&self) -> anyhow::Result<()> {
        // The default service account exists once the controllers run:
        // nothing can make pods before that.
        self.wait_for(
            Duration::from_secs(60),
            "the default service account",
            || {
                self.kubectl(&["get", "serviceaccount", "default", "-n", "default"])
                    .is_ok()
            },
        )
    }

    /// kubectl as the cluster admin, run on the control plane machine.
    pub fn kubectl_command(&self) -> Command {
        let mut cmd = self.host.command(&self.kubectl);
        cmd.arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()));
        cmd
    }

    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.kubectl_command();
        cmd.args(args);
        Ok(crate::util::output(&mut cmd)?)
    }

    /// `kubectl apply` of a manifest given as text.
    pub fn apply(&self, manifest: &str) -> anyhow::Result<()> {
        let mut cmd = self.kubectl_command();
        cmd.args(["apply", "-f", "-"]);
        crate::util::output_with_stdin(&mut cmd, manifest.as_bytes()).context("kubectl apply")?;
        Ok(())
    }

    /// Every daemon still running.
    pub fn check(&mut self) -> anyhow::Result<()> {
        for daemon in &mut self.daemons {
            daemon.check()?;
        }
        Ok(())
    }

    /// Polls `ready` while checking that the daemons still run.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        while !ready() {
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "{what}: not there after {timeout:?} (logs in {})",
                    self.host.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(())
    }

    /// A route on the control plane machine to a node's pod CIDR (the API
    /// server reaches pods when it proxies to them).
    pub fn route_pods(&self, pod_cidr: &str, node_address: &IpAddr) -> anyhow::Result<()> {
        let node_address = node_address.to_string();
        let node_address = node_address.as_str();
        self.host
            .run("ip", &["route", "replace", pod_cidr, "via", node_address])?;
        Ok(())
    }

    pub fn stop(&mut self) {
        while let Some(mut daemon) = self.daemons.pop() {
            daemon.stop();
        }
        self.host.shut_down();
    }
}

/// The cluster's switch on the control plane machine (a bridge every
/// node's uplink is plugged into, with the control plane's addresses), and
/// etcd's tmpfs.
fn set_up_switch(host: &Host, plan: &Plan) -> anyhow::Result<()> {
    let sh = |script: &str| host.run("sh", &["-euc", script]);
    // IPv6 without duplicate address detection: the segment is ours,
    // and a tentative address would fail the first binds.
    let ipv6 = if plan.dual_stack {
        format!(
            "ip addr add {}/{} dev {} nodad",
            plan::CONTROL_PLANE_ADDRESS6,
            plan::UNDERLAY6_PREFIX,
            plan::BRIDGE
        )
    } else {
        String::new()
    };
    sh(&format!(
        "ip link set lo up
             ip link add {bridge} type bridge
             ip addr add {address}/{prefix} dev {bridge}
             {ipv6}
             ip link set {bridge} up
             mkdir -p /var/lib/etcd && mount -t tmpfs -o size=512m tmpfs /var/lib/etcd",
        bridge = plan::BRIDGE,
        address = plan::CONTROL_PLANE_ADDRESS,
        prefix = plan::UNDERLAY_PREFIX,
    ))
    .context("setting up the control plane's network")?;
    Ok(())
}

/// The control plane's certificates and kubeconfigs.
struct Credentials {
    serving: Credential,
    kubelet_client: Credential,
    admin_kubeconfig: PathBuf,
    controller_manager_kubeconfig: PathBuf,
    scheduler_kubeconfig: PathBuf,
}

impl Credentials {
    fn issue(plan: &Plan, pki: &Pki) -> anyhow::Result<Self> {
        let server = plan.api_server_url();
        let address = IpAddr::V4(plan::CONTROL_PLANE_ADDRESS);

        // Certificates: the API server's, its client to the kubelets, and
        // one per control plane client.
        let serving = pki.server(
            "apiserver",
            "kube-apiserver",
            &[
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ],
            &[
                address,
                IpAddr::V4(plan::API_SERVICE_ADDRESS),
                IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            ],
        )?;
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            &Subject {
                user: "kube-apiserver-kubelet-client",
                groups: &["system:masters"],
            },
        )?;
        let admin = pki.client(
            "admin",
            &Subject {
                user: "kubernetes-admin",
                groups: &["system:masters"],
            },
        )?;
        let admin_kubeconfig = pki.kubeconfig("admin", &server, &admin)?;
        let controller_manager = pki.client(
            "controller-manager",
            &Subject {
                user: "system:kube-controller-manager",
                groups: &[],
            },
        )?;
        let controller_manager_kubeconfig =
            pki.kubeconfig("controller-manager", &server, &controller_manager)?;
        let scheduler = pki.client(
            "scheduler",
            &Subject {
                user: "system:kube-scheduler",
                groups: &[],
            },
        )?;
        let scheduler_kubeconfig = pki.kubeconfig("scheduler", &server, &scheduler)?;
        Ok(Credentials {
            serving,
            kubelet_client,
            admin_kubeconfig,
            controller_manager_kubeconfig,
            scheduler_kubeconfig,
        })
    }
}

/// kube-controller-manager's node CIDR sizes: per family on a dual-stack
/// cluster (the single flag is refused there), the single flag on an IPv4
/// one (the IPv6 flag is refused there).
fn node_cidr_mask_flags(dual_stack: bool) -> Vec<String> {
    if dual_stack {
        vec![
            "--node-cidr-mask-size-ipv4=24".to_string(),
            format!("--node-cidr-mask-size-ipv6={}", plan::NODE_CIDR_MASK6),
        ]
    } else {
        vec!["--node-cidr-mask-size=24".to_string()]
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_cluster_gets_no_ipv6_node_cidr_flag() {
        assert_eq!(node_cidr_mask_flags(false), ["--node-cidr-mask-size=24"]);
        let dual = node_cidr_mask_flags(true);
        assert!(
            dual.iter()
                .any(|f| f.starts_with("--node-cidr-mask-size-ipv6="))
        );
        assert!(!dual.contains(&"--node-cidr-mask-size=24".to_string()));
    }
}

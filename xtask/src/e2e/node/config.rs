//! What a node's daemons read: kubelet's and kube-proxy's configuration,
//! their credentials, containerd's configuration and its registries.

use anyhow::Context;
use std::path::{Path, PathBuf};

use flatnet_harness::containerd::{ContainerdConfig, Cri};

use super::super::build::Built;
use super::super::pki::{Pki, Subject};
use super::super::plan::{self, Plan};
use super::{Node, SOCKET};

/// Registries the e2e suite and kubelet name: each pointed at a closed
/// port of the node's loopback, so an image that was not imported fails at
/// once instead of reaching out.
const REGISTRIES: &[&str] = &[
    "docker.io",
    "registry-1.docker.io",
    "k8s.gcr.io",
    "gcr.io",
    "registry.k8s.io",
    "quay.io",
    "us.gcr.io",
    "invalid.com",
    "localhost",
];
const CLOSED_PORT: &str = "http://127.0.0.1:9";

impl Node {
    /// The host-side path of a file the node sees at `path`.
    fn file(&self, path: &str) -> PathBuf {
        self.host
            .dir
            .join("root")
            .join(path.trim_start_matches('/'))
    }

    fn write(&self, path: &str, text: &str) -> anyhow::Result<()> {
        let file = self.file(path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
    }

    pub(super) fn write_configuration(
        &self,
        plan: &Plan,
        pki: &Pki,
        built: &Built,
    ) -> anyhow::Result<()> {
        let server = plan.api_server_url();
        let name = &self.name;
        // Credentials: kubelet as system:node:<name> (Node authorizer and
        // NodeRestriction), its serving certificate for the API server's
        // exec/logs/proxy calls, kube-proxy as system:kube-proxy.
        let kubelet_client = pki.client(
            &format!("{name}-kubelet-client"),
            &Subject {
                user: &format!("system:node:{name}"),
                groups: &["system:nodes"],
            },
        )?;
        let kubelet_serving = pki.server(
            &format!("{name}-kubelet-serving"),
            name,
            &[name],
            &self.addresses,
        )?;
        let proxy = pki.client(
            &format!("{name}-kube-proxy"),
            &Subject {
                user: "system:kube-proxy",
                groups: &[],
            },
        )?;
        let copy = |from: &Path, to: &str| -> anyhow::Result<()> {
            self.write(to, &std::fs::read_to_string(from)?)
        };
        copy(&pki.ca_cert, "/etc/kubernetes/pki/ca.crt")?;
        copy(&kubelet_serving.cert, "/etc/kubernetes/pki/kubelet.crt")?;
        copy(&kubelet_serving.key, "/etc/kubernetes/pki/kubelet.key")?;
        copy(
            &pki.kubeconfig(&format!("{name}-kubelet"), &server, &kubelet_client)?,
            "/etc/kubernetes/kubelet.kubeconfig",
        )?;
        copy(
            &pki.kubeconfig(&format!("{name}-kube-proxy"), &server, &proxy)?,
            "/etc/kubernetes/kube-proxy.kubeconfig",
        )?;
        // Pods with dnsPolicy Default get the node's resolv.conf: a node
        // of this cluster has no resolver beyond the cluster's own.
        self.write("/etc/kubernetes/resolv.conf", "options ndots:1\n")?;
        self.write("/etc/kubernetes/kubelet.yaml", &self.kubelet_config())?;
        for mode in ["iptables", "nftables"] {
            self.write(
                &format!("/etc/kubernetes/kube-proxy-{mode}.yaml"),
                &self.kube_proxy_config(plan, mode),
            )?;
        }
        self.write(
            "/etc/containerd/config.toml",
            &containerd_config(&built.bin("containerd-shim-runc-v2")),
        )?;
        for registry in REGISTRIES {
            self.write(
                &format!("/etc/containerd/certs.d/{registry}/hosts.toml"),
                &format!(
                    "# {registry} cannot be reached from here: fail at once.\n\
                     server = \"{CLOSED_PORT}\"\n\n[host.\"{CLOSED_PORT}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )?;
        }
        Ok(())
    }

    fn kubelet_config(&self) -> String {
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
tlsCertFile: /etc/kubernetes/pki/kubelet.crt
tlsPrivateKeyFile: /etc/kubernetes/pki/kubelet.key
rotateCertificates: false
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
# This machine's cgroups are the hybrid layout (v1 controllers, v2 without
# them), which kubelet refuses since 1.35 unless told otherwise.
failCgroupV1: false
clusterDNS:
- {dns}
clusterDomain: {domain}
resolvConf: /etc/kubernetes/resolv.conf
failSwapOn: false
# This machine refuses a negative oom_score_adj (kubelet asks -999 for itself).
oomScoreAdj: 0
# Every image was imported by hand and none can be pulled again: never
# garbage-collect one.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
serializeImagePulls: false
"#,
            address = self.address,
            socket = SOCKET,
            cgroup_root = self.cgroup_root,
            dns = plan::DNS_SERVICE_ADDRESS,
            domain = plan::DNS_DOMAIN,
        )
    }

    fn kube_proxy_config(&self, plan: &Plan, mode: &str) -> String {
        format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/kube-proxy.kubeconfig
hostnameOverride: {name}
bindAddress: {address}
# Each node has a network namespace of its own: kube-proxy's defaults.
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: {cluster_cidr}
mode: {mode}
conntrack:
  # nf_conntrack_max is global (and read-only outside the host's network
  # namespace): left alone. The per-namespace TCP timeouts are set.
  maxPerCore: 0
  min: 0
"#,
            name = self.name,
            address = self.address,
            cluster_cidr = plan.cluster_cidrs(),
            mode = mode,
        )
    }
}

/// containerd 2 at its default paths (the node's own), CRI as kubelet
/// needs it, registries as `certs.d` says (here: each at a closed port).
pub(crate) fn containerd_config(shim: &Path) -> String {
    ContainerdConfig {
        paths: None,
        cri: Some(Cri {
            // The sandbox image, imported from pause.c.
            sandbox_image: crate::e2e::images::PAUSE.to_string(),
            cni_bin_dir: "/opt/cni/bin".into(),
            cni_conf_dir: "/etc/cni/net.d".into(),
            runc: None,
            registry_config_path: Some("/etc/containerd/certs.d".into()),
        }),
    }
    .to_toml_v3(shim)
}

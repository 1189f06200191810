//! A CRI client: what kubelet is to containerd. kubelet never runs a CNI
//! plugin itself; it sends RunPodSandbox, PodSandboxStatus, CreateContainer,
//! ExecSync, StopPodSandbox and RemovePodSandbox over containerd's socket,
//! and containerd's CRI plugin runs the CNI conflist through libcni. This
//! module speaks CRI v1 (the `k8s-cri` crate, tonic over a Unix socket) as
//! kubelet fills it in.
//!
//! The connection and the sandbox listing ([`connect`],
//! [`list_pod_sandboxes`]) are plain async functions with no test
//! harness in them, for the node agent's `ListPodSandbox` reconcile loop
//! to take as they are. [`CriClient`] wraps them and the rest in a
//! blocking API (a current-thread tokio runtime inside) for the tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, anyhow};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::Value;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long one CRI call may take before the client gives up on it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A channel to the CRI server listening on the Unix socket `socket`
/// (containerd's `--address`). The authority in the URI is a placeholder:
/// every connection goes to the socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket: PathBuf = socket.to_path_buf();
    Endpoint::from_static("http://[::1]:50051")
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
}

/// The runtime's pod sandboxes, or only those in `state` (kubelet's PLEG
/// and a reconcile loop ask for the ready ones).
pub async fn list_pod_sandboxes(
    client: &mut RuntimeServiceClient<Channel>,
    state: Option<cri::PodSandboxState>,
) -> Result<Vec<cri::PodSandbox>, tonic::Status> {
    let filter = state.map(|state| cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: state as i32,
        }),
        ..Default::default()
    });
    let response = client
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
        .await?;
    Ok(response.into_inner().items)
}

/// What a pod asks of its sandbox (the parts of a Pod object kubelet puts
/// into PodSandboxConfig).
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub port_mappings: Vec<cri::PortMapping>,
    pub annotations: HashMap<String, String>,
    pub dns: Option<cri::DnsConfig>,
}

impl PodSpec {
    /// A pod `name` in namespace `default` with a fresh UID.
    pub fn new(name: &str) -> Self {
        PodSpec {
            name: name.to_string(),
            namespace: "default".into(),
            uid: crate::unique("uid-"),
            ..Default::default()
        }
    }
}

/// PodSandboxStatus, the parts the tests judge.
#[derive(Debug, Clone)]
pub struct SandboxStatus {
    /// The primary address (`network.ip`), as kubelet puts it into the
    /// Pod's `status.podIP`.
    pub ip: String,
    pub additional_ips: Vec<String>,
    pub state: cri::PodSandboxState,
    /// From the verbose info: the sandbox process and its network namespace.
    pub pid: Option<u32>,
    pub netns: Option<PathBuf>,
}

/// A blocking CRI client for tests.
pub struct CriClient {
    runtime: tokio::runtime::Runtime,
    runtime_service: RuntimeServiceClient<Channel>,
    image_service: ImageServiceClient<Channel>,
    log_root: PathBuf,
    /// kubelet's per-pod cgroup parent (cgroupfs path); empty: containerd's
    /// default (/k8s.io/<id>).
    cgroup_parent: String,
    /// Each sandbox's config: CreateContainer is given it again, as kubelet does.
    sandbox_configs: Mutex<HashMap<String, cri::PodSandboxConfig>>,
}

impl CriClient {
    /// A client of the CRI server on `socket`; pods' log directories go
    /// under `log_root` (kubelet's /var/log/pods).
    pub fn connect(socket: &Path, log_root: &Path) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("a tokio runtime")?;
        let channel = runtime
            .block_on(connect(socket))
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(CriClient {
            runtime,
            runtime_service: RuntimeServiceClient::new(channel.clone()),
            image_service: ImageServiceClient::new(channel),
            log_root: log_root.to_path_buf(),
            cgroup_parent: String::new(),
            sandbox_configs: Mutex::new(HashMap::new()),
        })
    }

    /// Puts the sandboxes' (and so their containers') cgroups under
    /// `parent`, as kubelet puts them under kubepods.
    pub fn with_cgroup_parent(mut self, parent: &str) -> Self {
        self.cgroup_parent = parent.to_string();
        self
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.runtime_service.clone()
    }

    /// The runtime's name and version (Version).
    pub fn version(&self) -> anyhow::Result<String> {
        let mut rt = self.rt();
        let version = self
            .runtime
            .block_on(rt.version(cri::VersionRequest::default()))?
            .into_inner();
        Ok(format!(
            "{} {} (CRI {})",
            version.runtime_name, version.runtime_version, version.runtime_api_version
        ))
    }

    /// Status' conditions by type (RuntimeReady, NetworkReady) and the
    /// message of those not true.
    pub fn conditions(&self) -> anyhow::Result<HashMap<String, (bool, String)>> {
        let mut rt = self.rt();
        let status = self
            .runtime
            .block_on(rt.status(cri::StatusRequest { verbose: false }))?
            .into_inner();
        Ok(status
            .status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.r#type, (c.status, c.message)))
            .collect())
    }

    /// True when the image service knows `image` (ImageStatus).
    pub fn has_image(&self, image: &str) -> anyhow::Result<bool> {
        let mut images = self.image_service.clone();
        let status = self
            .runtime
            .block_on(images.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                verbose: false,
            }))?
            .into_inner();
        Ok(status.image.is_some())
    }

    /// The PodSandboxConfig kubelet builds for `pod`.
    pub fn sandbox_config(&self, pod: &PodSpec) -> cri::PodSandboxConfig {
        let log_directory = self
            .log_root
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid));
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt: 0,
            }),
            hostname: pod.name.clone(),
            log_directory: log_directory.display().to_string(),
            dns_config: pod.dns.clone(),
            port_mappings: pod.port_mappings.clone(),
            labels: HashMap::from([
                ("io.kubernetes.pod.name".into(), pod.name.clone()),
                ("io.kubernetes.pod.namespace".into(), pod.namespace.clone()),
                ("io.kubernetes.pod.uid".into(), pod.uid.clone()),
            ]),
            annotations: pod.annotations.clone(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Pod as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// RunPodSandbox: the sandbox's ID once its network is set up (CNI ADD
    /// has run by then).
    pub fn run_pod_sandbox(&self, pod: &PodSpec) -> anyhow::Result<String> {
        let config = self.sandbox_config(pod);
        std::fs::create_dir_all(&config.log_directory)
            .with_context(|| format!("creating {}", config.log_directory))?;
        let mut rt = self.rt();
        let id = self
            .runtime
            .block_on(rt.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }))
            .with_context(|| format!("RunPodSandbox {}", pod.name))?
            .into_inner()
            .pod_sandbox_id;
        self.configs().insert(id.clone(), config);
        Ok(id)
    }

    /// RunPodSandbox for every pod at once (concurrent calls on one
    /// connection, as kubelet's pod workers make them), in the order given.
    pub fn run_pod_sandboxes(&self, pods: &[PodSpec]) -> Vec<anyhow::Result<String>> {
        let configs: Vec<_> = pods.iter().map(|pod| self.sandbox_config(pod)).collect();
        for config in &configs {
            let _ = std::fs::create_dir_all(&config.log_directory);
        }
        let results = self.runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for (index, config) in configs.iter().enumerate() {
                let mut rt = self.rt();
                let config = config.clone();
                tasks.spawn(async move {
                    let result = rt
                        .run_pod_sandbox(cri::RunPodSandboxRequest {
                            config: Some(config),
                            runtime_handler: String::new(),
                        })
                        .await;
                    (index, result)
                });
            }
            let mut results: Vec<Option<anyhow::Result<String>>> =
                (0..configs.len()).map(|_| None).collect();
            while let Some(joined) = tasks.join_next().await {
                match joined {
                    Ok((index, result)) => {
                        results[index] = Some(
                            result
                                .map(|r| r.into_inner().pod_sandbox_id)
                                .map_err(|status| anyhow!("RunPodSandbox: {status}")),
                        );
                    }
                    Err(e) => return Err(anyhow!("a RunPodSandbox task failed: {e}")),
                }
            }
            Ok(results)
        });
        let results = match results {
            Ok(results) => results,
            Err(e) => return pods.iter().map(|_| Err(anyhow!("{e}"))).collect(),
        };
        results
            .into_iter()
            .zip(configs)
            .map(|(result, config)| {
                let id = result.unwrap_or_else(|| Err(anyhow!("no result")))?;
                self.configs().insert(id.clone(), config);
                Ok(id)
            })
            .collect()
    }

    fn configs(&self) -> std::sync::MutexGuard<'_, HashMap<String, cri::PodSandboxConfig>> {
        self.sandbox_configs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// PodSandboxStatus (verbose, for the sandbox's pid and netns).
    pub fn pod_sandbox_status(&self, id: &str) -> anyhow::Result<SandboxStatus> {
        let mut rt = self.rt();
        let response = self
            .runtime
            .block_on(rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            }))
            .with_context(|| format!("PodSandboxStatus {id}"))?
            .into_inner();
        let status = response
            .status
            .ok_or_else(|| anyhow!("PodSandboxStatus {id}: no status"))?;
        let network = status.network.unwrap_or_default();
        // containerd's verbose info: {"pid": .., "runtimeSpec": {"linux":
        // {"namespaces": [{"type": "network", "path": ..}, ..]}}, ..}.
        let info: Value = response
            .info
            .get("info")
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null);
        let pid = info["pid"]
            .as_u64()
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid != 0);
        let netns = info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .filter(|path| !path.is_empty())
            .map(PathBuf::from);
        Ok(SandboxStatus {
            ip: network.ip,
            additional_ips: network.additional_ips.into_iter().map(|ip| ip.ip).collect(),
            state: cri::PodSandboxState::try_from(status.state)
                .unwrap_or(cri::PodSandboxState::SandboxNotready),
            pid,
            netns,
        })
    }

    /// CreateContainer (with the sandbox's config again, as kubelet passes
    /// it) and StartContainer; the container's ID.
    pub fn create_and_start_container(
        &self,
        sandbox_id: &str,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> anyhow::Result<String> {
        let sandbox_config = self
            .configs()
            .get(sandbox_id)
            .cloned()
            .ok_or_else(|| anyhow!("sandbox {sandbox_id} was not run by this client"))?;
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.to_string(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            command: command.iter().map(|c| c.to_string()).collect(),
            log_path: format!("{name}/0.log"),
            labels: HashMap::from([("io.kubernetes.container.name".into(), name.to_string())]),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Pod as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut rt = self.rt();
        let container_id = self
            .runtime
            .block_on(rt.create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_string(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            }))
            .with_context(|| format!("CreateContainer {name} in {sandbox_id}"))?
            .into_inner()
            .container_id;
        self.runtime
            .block_on(rt.start_container(cri::StartContainerRequest {
                container_id: container_id.clone(),
            }))
            .with_context(|| format!("StartContainer {name} ({container_id})"))?;
        Ok(container_id)
    }

    /// ExecSync: (exit code, stdout, stderr) of `cmd` in the container.
    pub fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<(i32, Vec<u8>, Vec<u8>)> {
        let mut rt = self.rt();
        let response = self
            .runtime
            .block_on(rt.exec_sync(cri::ExecSyncRequest {
                container_id: container_id.to_string(),
                cmd: cmd.iter().map(|c| c.to_string()).collect(),
                timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            }))
            .with_context(|| format!("ExecSync {cmd:?} in {container_id}"))?
            .into_inner();
        Ok((response.exit_code, response.stdout, response.stderr))
    }

    /// StopPodSandbox: its containers stop and CNI DEL runs.
    pub fn stop_pod_sandbox(&self, id: &str) -> anyhow::Result<()> {
        let mut rt = self.rt();
        self.runtime
            .block_on(rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .with_context(|| format!("StopPodSandbox {id}"))?;
        Ok(())
    }

    /// RemovePodSandbox (after StopPodSandbox, as kubelet does).
    pub fn remove_pod_sandbox(&self, id: &str) -> anyhow::Result<()> {
        let mut rt = self.rt();
        self.runtime
            .block_on(rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .with_context(|| format!("RemovePodSandbox {id}"))?;
        self.configs().remove(id);
        Ok(())
    }

    /// StopPodSandbox then RemovePodSandbox for every ID at once.
    pub fn stop_and_remove_pod_sandboxes(&self, ids: &[String]) -> Vec<anyhow::Result<()>> {
        let results = self.runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for (index, id) in ids.iter().enumerate() {
                let mut rt = self.rt();
                let id = id.clone();
                tasks.spawn(async move {
                    let result = async {
                        rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await
                        .map_err(|s| anyhow!("StopPodSandbox {id}: {s}"))?;
                        rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await
                        .map_err(|s| anyhow!("RemovePodSandbox {id}: {s}"))?;
                        Ok(())
                    }
                    .await;
                    (index, result)
                });
            }
            let mut results: Vec<anyhow::Result<()>> =
                (0..ids.len()).map(|_| Err(anyhow!("not run"))).collect();
            while let Some(joined) = tasks.join_next().await {
                if let Ok((index, result)) = joined {
                    results[index] = result;
                }
            }
            results
        });
        let mut configs = self.configs();
        for (id, result) in ids.iter().zip(&results) {
            if result.is_ok() {
                configs.remove(id);
            }
        }
        results
    }

    /// ListPodSandbox: (ID, state) of every sandbox the runtime has.
    pub fn list_pod_sandbox(&self) -> anyhow::Result<Vec<(String, cri::PodSandboxState)>> {
        let mut rt = self.rt();
        let sandboxes = self
            .runtime
            .block_on(list_pod_sandboxes(&mut rt, None))
            .context("ListPodSandbox")?;
        Ok(sandboxes
            .into_iter()
            .map(|s| {
                let state = cri::PodSandboxState::try_from(s.state)
                    .unwrap_or(cri::PodSandboxState::SandboxNotready);
                (s.id, state)
            })
            .collect())
    }
}

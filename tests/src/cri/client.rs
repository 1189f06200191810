//! [`CriClient`]: the blocking client, its connection and the runtime's
//! own state (version, conditions, images).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::connect;

/// A blocking CRI client for tests.
pub struct CriClient {
    pub(super) runtime: tokio::runtime::Runtime,
    runtime_service: RuntimeServiceClient<Channel>,
    image_service: ImageServiceClient<Channel>,
    pub(super) log_root: PathBuf,
    /// kubelet's per-pod cgroup parent (cgroupfs path); empty: containerd's
    /// default (/k8s.io/<id>).
    pub(super) cgroup_parent: String,
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

    pub(super) fn rt(&self) -> RuntimeServiceClient<Channel> {
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

    pub(super) fn configs(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, cri::PodSandboxConfig>> {
        self.sandbox_configs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

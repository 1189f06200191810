//! The container calls of [`CriClient`]: CreateContainer with
//! StartContainer, and ExecSync.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, anyhow};
use k8s_cri::v1 as cri;

use super::CriClient;

impl CriClient {
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
}

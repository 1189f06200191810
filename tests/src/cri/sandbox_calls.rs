//! The pod sandbox calls of [`CriClient`]: RunPodSandbox,
//! PodSandboxStatus, StopPodSandbox, RemovePodSandbox, ListPodSandbox.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, anyhow};
use k8s_cri::v1 as cri;
use serde_json::Value;

use super::{CriClient, PodSpec, SandboxStatus, list_pod_sandboxes};

impl CriClient {
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

//! The container runtime's view of which pod sandboxes exist, asked over
//! CRI (`ListPodSandbox`, API v1) on the runtime's Unix socket, as kubelet
//! asks it. containerd's CRI plugin uses a sandbox's id as the CNI
//! container id of its attachments.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::ListPodSandboxRequest;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

use crate::error::{AgentError, Result};

/// How long one question to the runtime may take; a runtime that does not
/// answer is treated as "unknown" (nothing is reclaimed), never as empty.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A CRI runtime service reached through its socket; connected afresh for
/// each question, so a restarted runtime is simply asked again.
#[derive(Debug, Clone)]
pub struct Runtime {
    socket: PathBuf,
}

impl Runtime {
    pub fn new(socket: &Path) -> Self {
        Runtime {
            socket: socket.to_path_buf(),
        }
    }

    /// The ids of every sandbox the runtime has, ready or not (a NOTREADY
    /// sandbox still gets its DEL from the runtime when it is stopped).
    pub async fn sandbox_ids(&self) -> Result<HashSet<String>> {
        tokio::time::timeout(CALL_TIMEOUT, self.list())
            .await
            .map_err(|_| self.error(format!("no answer within {CALL_TIMEOUT:?}")))?
    }

    async fn list(&self) -> Result<HashSet<String>> {
        let socket = self.socket.clone();
        // The URI is a placeholder: the connector always dials the socket.
        let channel =
            Endpoint::from_static("http://[::]:50051")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await
                .map_err(|e| self.error(format!("connecting: {e}")))?;
        let response = RuntimeServiceClient::new(channel)
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|e| self.error(format!("ListPodSandbox: {}", e.message())))?;
        Ok(response
            .into_inner()
            .items
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    fn error(&self, what: String) -> AgentError {
        AgentError::Runtime(format!("CRI runtime at {}: {what}", self.socket.display()))
    }
}

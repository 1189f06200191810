//! The plain async calls, with no test harness in them: the connection to
//! a CRI socket and the sandbox listing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
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

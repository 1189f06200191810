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

mod async_calls;
mod client;
mod container_calls;
mod pod_sandbox;
mod sandbox_calls;

pub use async_calls::{CALL_TIMEOUT, connect, list_pod_sandboxes};
pub use client::CriClient;
pub use pod_sandbox::{PodSpec, SandboxStatus};

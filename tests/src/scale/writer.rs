//! The harness's writes to a real API server, from a thread of its own
//! inside the node's network namespace (where the server listens): each
//! object by server-side apply, its status too for Pods and Nodes (as the
//! kubelet writes it), deletes without grace (no kubelet is there to
//! confirm them).

use std::path::Path;
use std::sync::mpsc;

use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

use super::churn::Write;
use crate::kube_stub::Kind;

/// Writes to make, how many at once, and where to say how it went.
pub struct Job {
    pub writes: Vec<Write>,
    pub concurrency: usize,
    pub done: mpsc::Sender<Result<(), String>>,
}

const MANAGER: &str = "flatnet-scale";

fn resource(kind: Kind) -> (ApiResource, bool) {
    let (group, version, plural, namespaced) = match kind {
        Kind::Node => ("", "v1", "nodes", false),
        Kind::Pod => ("", "v1", "pods", true),
        Kind::Namespace => ("", "v1", "namespaces", false),
        Kind::NetworkPolicy => ("networking.k8s.io", "v1", "networkpolicies", true),
        Kind::Service => ("", "v1", "services", true),
        Kind::EndpointSlice => ("discovery.k8s.io", "v1", "endpointslices", true),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind.name());
    (ApiResource::from_gvk_with_plural(&gvk, plural), namespaced)
}

fn api(client: &Client, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
    let (resource, namespaced) = resource(kind);
    match (namespaced, namespace) {
        (true, Some(namespace)) => Api::namespaced_with(client.clone(), namespace, &resource),
        _ => Api::all_with(client.clone(), &resource),
    }
}

async fn write(client: &Client, write: Write) -> Result<(), String> {
    match write {
        Write::Put(kind, mut object) => {
            let (resource, _) = resource(kind);
            object["apiVersion"] = Value::from(resource.api_version.clone());
            object["kind"] = Value::from(resource.kind.clone());
            // The server gives these (the stub's objects carry their own).
            if let Some(meta) = object["metadata"].as_object_mut() {
                meta.remove("uid");
                meta.remove("resourceVersion");
            }
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
            let api = api(client, kind, namespace.as_deref());
            let params = PatchParams::apply(MANAGER).force();
            let status = object.as_object_mut().and_then(|o| o.remove("status"));
            api.patch(&name, &params, &Patch::Apply(&object))
                .await
                .map_err(|e| format!("applying {} {name}: {e}", kind.name()))?;
            if let Some(status) = status.filter(|_| matches!(kind, Kind::Pod | Kind::Node)) {
                let body = serde_json::json!({
                    "apiVersion": resource.api_version, "kind": resource.kind,
                    "metadata": {"name": name}, "status": status,
                });
                api.patch_status(&name, &params, &Patch::Apply(&body))
                    .await
                    .map_err(|e| format!("the status of {} {name}: {e}", kind.name()))?;
            }
            Ok(())
        }
        Write::Delete(kind, key) => {
            let (namespace, name) = match key.split_once('/') {
                Some((namespace, name)) => (Some(namespace), name),
                None => (None, key.as_str()),
            };
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            match api(client, kind, namespace).delete(name, &params).await {
                Ok(_) => Ok(()),
                // Gone already: what a delete wants.
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                Err(e) => Err(format!("deleting {} {key}: {e}", kind.name())),
            }
        }
    }
}

/// Enters `netns` for good (this thread is the writer's own) and makes
/// each job's writes until the channel closes.
pub fn serve(netns: &Path, kubeconfig: &Path, jobs: mpsc::Receiver<Job>) {
    let setup = || -> Result<(tokio::runtime::Runtime, Client), String> {
        crate::enter_thread(netns).map_err(|e| format!("entering the node: {e}"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = runtime.block_on(async {
            let kubeconfig = Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
            let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            Client::try_from(config).map_err(|e| e.to_string())
        })?;
        Ok((runtime, client))
    };
    let ready = setup();
    while let Ok(job) = jobs.recv() {
        let outcome = match &ready {
            Err(e) => Err(e.clone()),
            Ok((runtime, client)) => runtime.block_on(async {
                let results: Vec<Result<(), String>> = futures::stream::iter(job.writes)
                    .map(|w| write(client, w))
                    .buffer_unordered(job.concurrency.max(1))
                    .collect()
                    .await;
                results.into_iter().collect::<Result<(), String>>()
            }),
        };
        let _ = job.done.send(outcome);
    }
}

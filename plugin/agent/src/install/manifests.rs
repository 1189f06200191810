//! The Kubernetes manifests in xtask/deploy/kubernetes parse as the API's own
//! types (k8s-openapi) and agree with the agent: RBAC is get/list/watch on
//! what the agent watches, the DaemonSet mounts what the agent writes to, every
//! ConfigMap key is a setting the agent reads, images are named so that
//! containerd finds them, and the uninstall DaemonSet runs `--uninstall`
//! with the agent's settings and host paths.

use std::collections::BTreeSet;

use clap::CommandFactory;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;

use crate::config::Args;

const SERVICE_ACCOUNT: &str =
    include_str!("../../../../xtask/deploy/kubernetes/serviceaccount.yaml");
const RBAC: &str = include_str!("../../../../xtask/deploy/kubernetes/rbac.yaml");
const CONFIG_MAP: &str = include_str!("../../../../xtask/deploy/kubernetes/configmap.yaml");
const DAEMON_SET: &str = include_str!("../../../../xtask/deploy/kubernetes/daemonset.yaml");
const UNINSTALL: &str =
    include_str!("../../../../xtask/deploy/kubernetes/uninstall/daemonset.yaml");

/// Each YAML document as `T` (through JSON values, as kubectl does).
fn documents<T: DeserializeOwned>(text: &str) -> Vec<T> {
    let values: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).unwrap();
    values
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

fn one<T: DeserializeOwned>(text: &str) -> T {
    let mut all = documents::<T>(text);
    assert_eq!(all.len(), 1);
    all.remove(0)
}

#[test]
fn rbac_grants_reading_nodes_and_policy_objects_and_nothing_more() {
    let account: ServiceAccount = one(SERVICE_ACCOUNT);
    let values: Vec<serde_json::Value> = serde_saphyr::from_multiple(RBAC).unwrap();
    assert_eq!(values.len(), 2);
    let role: ClusterRole = serde_json::from_value(values[0].clone()).unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(values[1].clone()).unwrap();
    let rules = role.rules.unwrap();
    // (API group, resource) -> verbs: reading only, on exactly these.
    let mut granted: BTreeSet<(String, String)> = BTreeSet::new();
    for rule in &rules {
        let verbs: BTreeSet<&str> = rule.verbs.iter().map(String::as_str).collect();
        assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]));
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                granted.insert((group.clone(), resource.clone()));
            }
        }
    }
    let wanted: BTreeSet<(String, String)> = [
        ("", "nodes"),
        ("", "pods"),
        ("", "namespaces"),
        ("", "services"),
        ("networking.k8s.io", "networkpolicies"),
        ("discovery.k8s.io", "endpointslices"),
        ("policy.networking.k8s.io", "clusternetworkpolicies"),
    ]
    .iter()
    .map(|(g, r)| (g.to_string(), r.to_string()))
    .collect();
    assert_eq!(granted, wanted);
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(binding.role_ref.name), role.metadata.name);
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(Some(subject.name.clone()), account.metadata.name);
    assert_eq!(subject.namespace, account.metadata.namespace);
}

#[test]
fn the_daemon_set_runs_the_agent_on_the_host_network_with_the_host_paths() {
    let set: DaemonSet = one(DAEMON_SET);
    let account: ServiceAccount = one(SERVICE_ACCOUNT);
    let config: ConfigMap = one(CONFIG_MAP);
    let pod = set.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name, account.metadata.name);
    assert!(
        pod.tolerations
            .unwrap()
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "the agent must run on every node"
    );
    let container = &pod.containers[0];
    assert!(container.command.as_ref().unwrap()[0].ends_with("/flatnet-agent"));
    assert_eq!(
        container.security_context.as_ref().unwrap().privileged,
        Some(true)
    );
    let node_name = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .unwrap();
    let field = node_name
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "spec.nodeName");
    let env_from = &container.env_from.as_ref().unwrap()[0];
    assert_eq!(
        env_from.config_map_ref.as_ref().unwrap().name,
        config.metadata.name.unwrap()
    );
    // Each host path the agent and the plugin share, at the same path inside.
    let volumes = pod.volumes.unwrap();
    let mounts = container.volume_mounts.as_ref().unwrap();
    for path in [
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/sys/fs/bpf",
        "/run/flatnet",
        "/var/lib/cni",
        "/run/containerd/containerd.sock",
    ] {
        let volume = volumes
            .iter()
            .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == path))
            .unwrap_or_else(|| panic!("no hostPath volume for {path}"));
        let mount = mounts
            .iter()
            .find(|m| m.name == volume.name)
            .unwrap_or_else(|| panic!("{path} is not mounted"));
        assert_eq!(mount.mount_path, path);
    }
    let bpffs = mounts
        .iter()
        .find(|m| m.mount_path == "/sys/fs/bpf")
        .unwrap();
    assert_eq!(bpffs.mount_propagation.as_deref(), Some("Bidirectional"));
    // The readiness probe asks the agent's metrics port.
    let probe = container
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(probe.path.as_deref(), Some("/readyz"));
    let data = config.data.unwrap();
    let metrics_addr: std::net::SocketAddr = data["FLATNET_METRICS_ADDR"].parse().unwrap();
    assert_eq!(
        probe.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
            metrics_addr.port()
        ))
    );
}

#[test]
fn every_config_map_key_is_a_setting_the_agent_reads() {
    let config: ConfigMap = one(CONFIG_MAP);
    let known: BTreeSet<String> = Args::command()
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    let data = config.data.unwrap();
    assert!(!data.is_empty());
    for key in data.keys() {
        assert!(known.contains(key), "{key} is not a flatnet-agent setting");
    }
    // And the values parse as the agent would take them.
    let mut argv = vec!["flatnet-agent".to_string(), "--node-name=n1".into()];
    let by_env: Vec<(String, String)> = Args::command()
        .get_arguments()
        .filter_map(|arg| {
            Some((
                arg.get_env()?.to_string_lossy().into_owned(),
                arg.get_id().to_string(),
            ))
        })
        .collect();
    for (key, value) in &data {
        let (_, id) = by_env.iter().find(|(env, _)| env == key).unwrap();
        argv.push(format!("--{}={value}", id.replace('_', "-")));
    }
    if let Err(e) = <Args as clap::Parser>::try_parse_from(&argv) {
        panic!("the ConfigMap's values do not parse: {e}");
    }
}

/// The registry domain of an image reference as containerd resolves it:
/// the first path component when it looks like a host (has a dot or a
/// port, or is `localhost`), else docker.io.
fn image_domain(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

#[test]
fn images_are_named_as_podman_stores_them() {
    // `podman build -t localhost/flatnet:0.1.0` stores that name; a bare
    // `flatnet:0.1.0` would make containerd look on docker.io.
    assert_eq!(image_domain("flatnet:0.1.0"), "docker.io");
    assert_eq!(
        image_domain("registry.example:5000/flatnet:0.1.0"),
        "registry.example:5000"
    );
    let set: DaemonSet = one(DAEMON_SET);
    let uninstall: DaemonSet = one(UNINSTALL);
    let agent_image = set.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert_eq!(image_domain(&agent_image), "localhost", "{agent_image}");
    let pod = uninstall.spec.template.spec.unwrap();
    for container in pod.init_containers.unwrap().iter().chain(&pod.containers) {
        assert_eq!(container.image.as_deref(), Some(agent_image.as_str()));
    }
}

#[test]
fn the_uninstall_daemon_set_runs_uninstall_with_the_agents_settings() {
    let agent: DaemonSet = one(DAEMON_SET);
    let uninstall: DaemonSet = one(UNINSTALL);
    let config: ConfigMap = one(CONFIG_MAP);
    assert_ne!(uninstall.metadata.name, agent.metadata.name);
    let agent_pod = agent.spec.template.spec.unwrap();
    let pod = uninstall.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    let init = &pod.init_containers.as_ref().unwrap()[0];
    let command = init.command.as_ref().unwrap();
    assert!(command[0].ends_with("/flatnet-agent"));
    assert!(command.contains(&"--uninstall".to_string()));
    assert_eq!(
        init.security_context.as_ref().unwrap().privileged,
        Some(true)
    );
    assert_eq!(
        init.env_from.as_ref().unwrap()[0]
            .config_map_ref
            .as_ref()
            .unwrap()
            .name,
        config.metadata.name.clone().unwrap()
    );
    // The same host paths as the agent, at the same places.
    let agent_volumes = agent_pod.volumes.unwrap();
    let volumes = pod.volumes.unwrap();
    for path in ["/etc/cni/net.d", "/sys/fs/bpf", "/run/flatnet"] {
        let host_path = |vs: &[k8s_openapi::api::core::v1::Volume]| {
            vs.iter()
                .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == path))
                .map(|v| v.name.clone())
        };
        assert!(host_path(&agent_volumes).is_some());
        let name = host_path(&volumes).unwrap_or_else(|| panic!("no hostPath volume for {path}"));
        let mount = init
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{path} is not mounted"));
        assert_eq!(mount.mount_path, path);
    }
    // The ConfigMap's values with --uninstall parse without a node name.
    let mut argv = vec!["flatnet-agent".to_string()];
    argv.extend(command[1..].iter().cloned());
    for (key, value) in config.data.unwrap() {
        let arg = Args::command()
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e.to_string_lossy() == key))
            .map(|a| a.get_id().to_string())
            .unwrap();
        argv.push(format!("--{}={value}", arg.replace('_', "-")));
    }
    let args =
        <Args as clap::Parser>::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(args.uninstall);
}

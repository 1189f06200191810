//! Leak-proof addresses. containerd never runs CNI GC, so an attachment
//! whose DEL never came (the runtime killed mid-ADD, a node crash, a
//! sandbox removed behind the runtime's back) would keep its address
//! forever. Every resync the agent compares the network's IPAM allocations
//! with the sandboxes the runtime has (CRI `ListPodSandbox`) and, for an
//! attachment no sandbox has owned for the whole grace period, runs the
//! conflist's DEL as the runtime would have (plugins in reverse order,
//! prevResult from libcni's cache): flatnet takes the pod out of the
//! datapath and deletes its veth, portmap and bandwidth drop their rules
//! and qdiscs, flatnet-ipam frees the address.
//!
//! The race with an ADD in flight: its address is allocated before the
//! runtime lists its sandbox (containerd adds it to its store only after
//! the network is set up). An attachment is released only after it has been
//! seen without a sandbox, continuously, for the grace period; an ADD is
//! listed long before that, so it is never taken. A runtime that does not
//! answer releases nothing.

pub mod cri;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use ipnetwork::IpNetwork;

use crate::config::Args;
use crate::error::{AgentError, Result};
use crate::metrics::{AgentMetrics, RangeLabel};
use crate::reclaim::cri::Runtime;
use flatnet_ipam::config::DEFAULT_DATA_DIR;
use flatnet_ipam::store::{AllocationStore, DiskStore};

/// One attachment of the network: what CNI calls (container id, ifname).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

impl std::fmt::Display for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.container_id, self.ifname)
    }
}

/// What one pass decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Without a sandbox for at least the grace period: DEL them.
    pub release: Vec<Attachment>,
    /// Without a sandbox, but not for long enough yet.
    pub waiting: Vec<Attachment>,
}

/// When each attachment was first seen without a sandbox, across passes.
#[derive(Debug, Default)]
pub struct Tracker {
    unowned_since: HashMap<Attachment, Instant>,
}

impl Tracker {
    /// The pure decision of a pass: `held` are the allocations' attachments,
    /// `live` the runtime's sandbox ids. An attachment of a live sandbox (any
    /// ifname) is kept and forgotten; one that is no longer held is forgotten.
    pub fn plan(
        &mut self,
        held: &BTreeSet<Attachment>,
        live: &HashSet<String>,
        now: Instant,
        grace: Duration,
    ) -> Plan {
        self.unowned_since
            .retain(|a, _| held.contains(a) && !live.contains(&a.container_id));
        let mut plan = Plan::default();
        for attachment in held {
            if live.contains(&attachment.container_id) {
                continue;
            }
            let since = *self.unowned_since.entry(attachment.clone()).or_insert(now);
            if now.saturating_duration_since(since) >= grace {
                plan.release.push(attachment.clone());
            } else {
                plan.waiting.push(attachment.clone());
            }
        }
        plan
    }
}

/// What a pass did, for logs and metrics.
#[derive(Debug, Default)]
pub struct Outcome {
    pub released: Vec<Attachment>,
    pub failed: Vec<AgentError>,
    pub waiting: usize,
    /// Allocations per range set (index into the conflist's ranges).
    pub in_use: BTreeMap<usize, usize>,
}

/// The reclaim loop's state and where it finds things on the node.
#[derive(Debug)]
pub struct Reclaimer {
    pub runtime: Runtime,
    pub grace: Duration,
    /// flatnet-ipam's store of this network (`<dataDir>/<network>`).
    pub store_dir: PathBuf,
    /// The conflist the agent writes (what the runtime runs).
    pub conflist: PathBuf,
    pub bin_dir: PathBuf,
    /// libcni's cache dir (`results/` inside).
    pub cache_dir: PathBuf,
    pub tracker: Tracker,
}

impl Reclaimer {
    /// The reclaimer of the agent's network on this node.
    pub fn for_node(args: &Args, socket: &Path) -> Self {
        let data_dir = args
            .ipam_data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        Reclaimer {
            runtime: Runtime::new(socket),
            grace: Duration::from_secs_f64(args.reclaim_grace_secs.max(0.0)),
            store_dir: data_dir.join(&args.network),
            conflist: args.cni_conf_dir.join(&args.conflist_name),
            bin_dir: args.cni_bin_dir.clone(),
            cache_dir: args.cni_cache_dir.clone(),
            tracker: Tracker::default(),
        }
    }

    /// A pass with its logs and metrics; `pod_cidrs` name the range sets.
    pub async fn run_pass(&mut self, metrics: &AgentMetrics, pod_cidrs: &[IpNetwork]) {
        let outcome = match self.pass().await {
            Ok(outcome) => outcome,
            Err(e) => {
                metrics.reclaim_failures.inc();
                tracing::warn!(error = %e, "reclaim pass skipped: nothing released");
                return;
            }
        };
        metrics.reclaim_passes.inc();
        metrics.reclaim_waiting.set(outcome.waiting as i64);
        for (set, cidr) in pod_cidrs.iter().enumerate() {
            let in_use = outcome.in_use.get(&set).copied().unwrap_or(0);
            metrics
                .ipam_allocations
                .get_or_create(&RangeLabel {
                    range: cidr.to_string(),
                })
                .set(in_use as i64);
        }
        for attachment in &outcome.released {
            metrics.ipam_reclaimed.inc();
            tracing::info!(%attachment, grace = ?self.grace, "no sandbox owns it: released");
        }
        for e in &outcome.failed {
            metrics.reclaim_failures.inc();
            tracing::warn!(error = %e, "reclaim DEL failed; retrying at the next resync");
        }
    }

    /// One pass: allocations first, then the runtime's sandboxes (an ADD
    /// finishing in between is listed, or waits out the grace period).
    pub async fn pass(&mut self) -> Result<Outcome> {
        let records = allocations(&self.store_dir)?;
        let live = self.runtime.sandbox_ids().await?;
        let mut outcome = Outcome::default();
        let mut held = BTreeSet::new();
        for record in records {
            *outcome.in_use.entry(record.range_set).or_default() += 1;
            held.insert(Attachment {
                container_id: record.container_id,
                ifname: record.ifname,
            });
        }
        let plan = self.tracker.plan(&held, &live, Instant::now(), self.grace);
        outcome.waiting = plan.waiting.len();
        for attachment in plan.release {
            match self.release(&attachment).await {
                Ok(()) => outcome.released.push(attachment),
                Err(e) => outcome.failed.push(e),
            }
        }
        Ok(outcome)
    }

    /// The conflist's DEL for `attachment`, as libcni runs it: plugins in
    /// reverse order, each with the list's name and version and the cached
    /// result; every plugin runs even when one fails (the failure is
    /// reported, and the next pass tries again).
    async fn release(&self, attachment: &Attachment) -> Result<()> {
        let fail = |reason: String| AgentError::Reclaim {
            attachment: attachment.to_string(),
            reason,
        };
        let text = std::fs::read(&self.conflist)
            .map_err(|e| fail(format!("reading {}: {e}", self.conflist.display())))?;
        let list: Value = serde_json::from_slice(&text)
            .map_err(|e| fail(format!("{}: {e}", self.conflist.display())))?;
        let network = list["name"].as_str().unwrap_or_default().to_string();
        let cache_file = self.cache_dir.join("results").join(format!(
            "{network}-{}-{}",
            attachment.container_id, attachment.ifname
        ));
        let cached: Option<Value> = std::fs::read(&cache_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
        let mut failures = Vec::new();
        for plugin in plugins.iter().rev() {
            let stdin = plugin_del_config(&list, plugin, cached.as_ref());
            if let Err(reason) = self.run_del(attachment, &stdin).await {
                failures.push(reason);
            }
        }
        if !failures.is_empty() {
            return Err(fail(failures.join("; ")));
        }
        // As libcni does after a successful DEL.
        match std::fs::remove_file(&cache_file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(fail(format!("removing {}: {e}", cache_file.display())))
            }
            _ => Ok(()),
        }
    }

    /// One plugin's DEL; no CNI_NETNS (the namespace is gone or not ours to
    /// enter: every plugin of the list tears down from the host side).
    async fn run_del(&self, attachment: &Attachment, stdin: &Value) -> Result<(), String> {
        let kind = stdin["type"].as_str().unwrap_or_default().to_string();
        let binary = self.bin_dir.join(&kind);
        let mut child = tokio::process::Command::new(&binary)
            .env_clear()
            .env("CNI_COMMAND", "DEL")
            .env("CNI_CONTAINERID", &attachment.container_id)
            .env("CNI_IFNAME", &attachment.ifname)
            .env("CNI_PATH", &self.bin_dir)
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("running {}: {e}", binary.display()))?;
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin.to_string().as_bytes()).await;
        }
        let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .map_err(|_| format!("{kind} DEL did not finish within 30 s"))?
            .map_err(|e| format!("{kind} DEL: {e}"))?;
        if output.status.success() {
            return Ok(());
        }
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        let msg = answer["msg"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&output.stderr).trim().to_string());
        Err(format!("{kind} DEL failed ({}): {msg}", output.status))
    }
}

/// The attachments flatnet-ipam's store holds (empty when there is no
/// store yet). The store's lock is held only while reading.
fn allocations(store_dir: &Path) -> Result<Vec<flatnet_ipam::store::Record>> {
    if !store_dir.exists() {
        return Ok(Vec::new());
    }
    let mut store = DiskStore::open(store_dir, false)?;
    Ok(store.records()?)
}

/// One plugin's configuration for DEL, built the way libcni builds it: the
/// plugin's entry with the list's name and version, the cached result as
/// prevResult, and the cached capability arguments the plugin declares as
/// runtimeConfig.
fn plugin_del_config(list: &Value, plugin: &Value, cached: Option<&Value>) -> Value {
    let mut config = plugin.clone();
    config["name"] = list["name"].clone();
    config["cniVersion"] = list["cniVersion"].clone();
    let Some(cached) = cached else {
        return config;
    };
    if let Some(result) = cached.get("result").filter(|r| !r.is_null()) {
        config["prevResult"] = result.clone();
    }
    if let (Some(declared), Some(arguments)) = (
        plugin["capabilities"].as_object(),
        cached["capabilityArgs"].as_object(),
    ) {
        let runtime_config: serde_json::Map<String, Value> = arguments
            .iter()
            .filter(|(key, _)| declared.get(*key) == Some(&json!(true)))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if !runtime_config.is_empty() {
            config["runtimeConfig"] = Value::Object(runtime_config);
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(id: &str) -> Attachment {
        Attachment {
            container_id: id.into(),
            ifname: "eth0".into(),
        }
    }

    fn held(ids: &[&str]) -> BTreeSet<Attachment> {
        ids.iter().map(|id| attachment(id)).collect()
    }

    fn live(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    #[test]
    fn an_unowned_attachment_is_released_only_after_the_grace_period() {
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut tracker = Tracker::default();
        let plan = tracker.plan(&held(&["a", "b"]), &live(&["a"]), t0, grace);
        assert!(plan.release.is_empty());
        assert_eq!(plan.waiting, [attachment("b")]);
        let plan = tracker.plan(&held(&["a", "b"]), &live(&["a"]), t0 + grace / 2, grace);
        assert!(plan.release.is_empty());
        let plan = tracker.plan(&held(&["a", "b"]), &live(&["a"]), t0 + grace, grace);
        assert_eq!(plan.release, [attachment("b")]);
        assert!(plan.waiting.is_empty());
    }

    #[test]
    fn an_add_in_flight_is_kept_once_its_sandbox_appears() {
        // Allocated, not listed yet; listed at the next pass; then gone
        // from the runtime for good much later: the clock starts again.
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut tracker = Tracker::default();
        tracker.plan(&held(&["new"]), &live(&[]), t0, grace);
        let plan = tracker.plan(&held(&["new"]), &live(&["new"]), t0 + grace / 4, grace);
        assert_eq!(plan, Plan::default());
        let gone = t0 + grace * 3;
        let plan = tracker.plan(&held(&["new"]), &live(&[]), gone, grace);
        assert_eq!(plan.waiting, [attachment("new")]);
        let plan = tracker.plan(&held(&["new"]), &live(&[]), gone + grace, grace);
        assert_eq!(plan.release, [attachment("new")]);
    }

    #[test]
    fn every_ifname_of_a_live_sandbox_is_kept_and_released_ones_are_forgotten() {
        let grace = Duration::ZERO;
        let now = Instant::now();
        let mut tracker = Tracker::default();
        let mut both = held(&["s"]);
        both.insert(Attachment {
            container_id: "s".into(),
            ifname: "net1".into(),
        });
        assert_eq!(
            tracker.plan(&both, &live(&["s"]), now, grace),
            Plan::default()
        );
        let plan = tracker.plan(&held(&["x"]), &live(&[]), now, grace);
        assert_eq!(plan.release, [attachment("x")]);
        // No longer held (its DEL came after all): nothing is remembered.
        tracker.plan(&held(&[]), &live(&[]), now, grace);
        assert!(tracker.unowned_since.is_empty());
    }

    #[test]
    fn del_configs_carry_the_cached_result_and_declared_capabilities_only() {
        let list = json!({"cniVersion": "1.0.0", "name": "pods", "plugins": []});
        let portmap =
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true});
        let cached = json!({
            "kind": "cniCacheV1",
            "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.5/24"}]},
            "capabilityArgs": {
                "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
                "bandwidth": {"ingressRate": 1000}
            }
        });
        let config = plugin_del_config(&list, &portmap, Some(&cached));
        assert_eq!(config["name"], "pods");
        assert_eq!(config["cniVersion"], "1.0.0");
        assert_eq!(config["prevResult"]["ips"][0]["address"], "10.0.0.5/24");
        assert_eq!(config["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
        assert!(config["runtimeConfig"].get("bandwidth").is_none());
        let bare = plugin_del_config(&list, &portmap, None);
        assert!(bare.get("prevResult").is_none() && bare.get("runtimeConfig").is_none());
    }
}

//! What a benchmark run left in results/, read back (`Results`): bench.json's
//! run and rounds, and the optional sections' files (services.json,
//! cri.json, program-cost.json, overlay.json, e2e-<mode>.json,
//! scale.json), as the
//! generated docs' text is written from them.

use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;

use super::control::CniTimes;
use super::rows::Config;
use super::samples::{DataSample, Round};

/// Every path label a round may hold (the keys of bench.json's `data` and
/// `cni`), as the report's code names them.
const PATH_LABELS: [&str; 8] = [
    "bridge",
    "flatnet",
    "flatnet-xdp",
    "veth",
    "veth-big",
    super::policy::LABEL,
    "flatnet-nofsync",
    super::before::LABEL,
];

/// What results/ holds; only bench.json must exist.
pub struct Results {
    pub(super) run: Value,
    pub(super) rounds: Vec<Round>,
    pub(super) config: Config,
    pub(super) services: Option<Value>,
    pub(super) cri: Option<Value>,
    pub(super) program_cost: Option<Value>,
    /// Pods on two nodes over VXLAN (overlay.json).
    pub(super) overlay: Option<Value>,
    /// One report per Services mode, in file-name order.
    pub(super) e2e: Vec<Value>,
    /// The agent at cluster scale (scale.json, `cargo xtask scale`).
    pub(super) scale: Option<Value>,
}

fn label(name: &str) -> anyhow::Result<&'static str> {
    PATH_LABELS
        .iter()
        .find(|known| **known == name)
        .copied()
        .with_context(|| format!("bench.json names an unknown path {name:?}"))
}

/// A number of a sample; JSON null (not measured on that path) is NaN, as
/// in the run itself.
pub(super) fn field(value: &Value, name: &str) -> f64 {
    value[name].as_f64().unwrap_or(f64::NAN)
}

fn round(value: &Value) -> anyhow::Result<Round> {
    let mut round = Round::default();
    if let Some(data) = value["data"].as_object() {
        for (name, sample) in data {
            round.data.insert(
                label(name)?,
                DataSample {
                    tcp_gbps: field(sample, "tcp_gbps"),
                    rr_p50_us: field(sample, "rr_p50_us"),
                    rr_p99_us: field(sample, "rr_p99_us"),
                    udp_kpps: field(sample, "udp_kpps"),
                    clusterip_rr_p50_us: field(sample, "clusterip_rr_p50_us"),
                    program_ns: field(sample, "program_ns"),
                    program_tcp_ns: field(sample, "program_tcp_ns"),
                    clusterip_program_ns: field(sample, "clusterip_program_ns"),
                    program_floor_ns: field(sample, "program_floor_ns"),
                },
            );
        }
    }
    round.variants = super::variants::parse(value);
    if let Some(cni) = value["cni"].as_object() {
        for (name, times) in cni {
            round.cni.insert(
                label(name)?,
                CniTimes {
                    ipam_add_sequential: field(times, "ipam_add_sequential_ms"),
                    ipam_add_concurrent: field(times, "ipam_add_concurrent_ms_per_pod"),
                    add_sequential: field(times, "add_sequential_ms"),
                    del_sequential: field(times, "del_sequential_ms"),
                    add_concurrent: field(times, "add_concurrent_ms_per_pod"),
                    del_concurrent: field(times, "del_concurrent_ms_per_pod"),
                },
            );
        }
    }
    Ok(round)
}

fn count(run: &Value, name: &str) -> anyhow::Result<usize> {
    run[name]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .with_context(|| format!("bench.json: run.{name} is missing or not a count"))
}

impl Results {
    /// Parses the files' contents (bench.json's, then the optional ones).
    pub fn parse(
        bench: &str,
        services: Option<&str>,
        cri: Option<&str>,
        program_cost: Option<&str>,
        overlay: Option<&str>,
        e2e: &[String],
    ) -> anyhow::Result<Self> {
        let bench: Value = serde_json::from_str(bench).context("bench.json is not JSON")?;
        let run = bench["run"].clone();
        if !run.is_object() {
            bail!(
                "bench.json has no \"run\" object (written by `cargo xtask bench`: date, commit, machine, rounds, ...)"
            );
        }
        let rounds = bench["rounds"]
            .as_array()
            .context("bench.json has no \"rounds\" list")?
            .iter()
            .map(round)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let config = Config {
            rounds: count(&run, "rounds")?,
            seconds: u32::try_from(count(&run, "seconds")?)?,
            sequential: count(&run, "sequential")?,
            concurrent: count(&run, "concurrent")?,
            flatnet_ipam: run["flatnet_ipam"].as_str().unwrap_or("").to_string(),
            before: run["before"].as_str().map(str::to_string),
        };
        let json = |text: &str, what: &str| -> anyhow::Result<Value> {
            serde_json::from_str(text).with_context(|| format!("{what} is not JSON"))
        };
        Ok(Results {
            run,
            rounds,
            config,
            services: services.map(|t| json(t, "services.json")).transpose()?,
            cri: cri.map(|t| json(t, "cri.json")).transpose()?,
            program_cost: program_cost
                .map(|t| json(t, "program-cost.json"))
                .transpose()?,
            overlay: overlay.map(|t| json(t, "overlay.json")).transpose()?,
            e2e: e2e
                .iter()
                .map(|t| json(t, "an e2e-<mode>.json"))
                .collect::<anyhow::Result<Vec<_>>>()?,
            scale: None,
        })
    }

    /// Reads results/ (`dir`).
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let bench = read("bench.json").with_context(|| {
            format!(
                "{} is missing: run `cargo xtask bench` first",
                dir.join("bench.json").display()
            )
        })?;
        let mut e2e_files: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("e2e-") && name.ends_with(".json"))
            .collect();
        e2e_files.sort();
        let e2e: Vec<String> = e2e_files.iter().filter_map(|name| read(name)).collect();
        let mut results = Self::parse(
            &bench,
            read("services.json").as_deref(),
            read("cri.json").as_deref(),
            read("program-cost.json").as_deref(),
            read("overlay.json").as_deref(),
            &e2e,
        )?;
        results.scale = read("scale.json")
            .map(|text| serde_json::from_str(&text).context("scale.json is not JSON"))
            .transpose()?;
        Ok(results)
    }
}

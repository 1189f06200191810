//! docs/benchmarks.md and the README's benchmark table, written from the
//! files a benchmark run left in results/ (bench.json, services.json,
//! cri.json, e2e-<mode>.json), never by hand: the numbers people read are
//! always the numbers measured. The prose around them is
//! benchmarks.template.md, whose `{{name}}` placeholders are filled here.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;

use super::control::CniTimes;
use super::figures;
use super::report::{self, Config};
use super::samples::{DataSample, Round};
use crate::markers::Section;

const TEMPLATE: &str = include_str!("benchmarks.template.md");
/// The README's generated section lies between these two lines.
pub const TABLE_START: &str = "<!-- bench-table -->";
pub const TABLE_END: &str = "<!-- /bench-table -->";

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
    run: Value,
    rounds: Vec<Round>,
    config: Config,
    services: Option<Value>,
    cri: Option<Value>,
    program_cost: Option<Value>,
    /// Pods on two nodes over VXLAN (overlay.json).
    overlay: Option<Value>,
    /// One report per Services mode, in file-name order.
    e2e: Vec<Value>,
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
fn field(value: &Value, name: &str) -> f64 {
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
        Self::parse(
            &bench,
            read("services.json").as_deref(),
            read("cri.json").as_deref(),
            read("program-cost.json").as_deref(),
            read("overlay.json").as_deref(),
            &e2e,
        )
    }

    /// When, where and how the run was made: one line.
    fn run_line(&self) -> String {
        let text = |name: &str| self.run[name].as_str().unwrap_or("?").to_string();
        format!(
            "{}, commit {}; {}; {} interleaved round(s), {} s per data-plane measurement.",
            text("date"),
            text("commit"),
            text("machine"),
            self.config.rounds,
            self.config.seconds
        )
    }

    fn main_table(&self) -> String {
        report::table(&report::rows(&self.rounds, &self.config))
    }

    fn services_summary(&self) -> String {
        let Some(services) = &self.services else {
            return "No Services run in `results/` (services.json is missing).".into();
        };
        let rows = services["rows"].as_array().cloned().unwrap_or_default();
        let (Some(fewest), Some(most)) = (rows.first(), rows.last()) else {
            return "services.json holds no measurement.".into();
        };
        let rate = |row: &Value, path: &str| field(&row[path], "per_second");
        let seconds = services["seconds"].as_f64().unwrap_or(f64::NAN);
        let slices = most["ebpf"]["slices"].as_u64().unwrap_or(1).max(1);
        let counts: Vec<String> = rows.iter().map(|r| r["services"].to_string()).collect();
        let verdict = |met: bool| if met { "met" } else { "MISSED" };
        let itself = rate(most, "ebpf") / rate(fewest, "ebpf");
        let iptables = rate(most, "ebpf") / rate(most, "iptables");
        let nftables = rate(most, "ebpf") / rate(most, "nftables");
        let mut out = format!(
            "Connect + 64-byte request/response per connection to a ClusterIP, medians of {slices} \
             interleaved {:.1} s slices per path, with {} Services installed; and one \
             EndpointSlice change. flatnet at {} Services was {itself:.2}x of itself at {} \
             (target: within 5%, {}), {iptables:.2}x kube-proxy's iptables mode and \
             {nftables:.2}x its nftables mode (target: ahead of both, {})",
            seconds / slices as f64,
            counts.join(", "),
            most["services"],
            fewest["services"],
            verdict(itself >= 0.95),
            verdict(iptables > 1.0 && nftables > 1.0),
        );
        let updates = services["updates"].as_array().cloned().unwrap_or_default();
        if let Some(update) = updates.last() {
            let map_us = field(update, "map_update_us");
            let _ = write!(
                out,
                ", and with {} Services an update took {} us in the maps against {:.1} s for \
                 iptables-restore (target: under 10 ms, {})",
                update["services"],
                figures::number(map_us),
                field(update, "iptables_restore_us") / 1e6,
                verdict(map_us < 10_000.0),
            );
        }
        out.push('.');
        let nodeport = services["nodeport"]["rows"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let (Some(fewest), Some(most)) = (nodeport.first(), nodeport.last()) {
            let itself = rate(most, "ebpf") / rate(fewest, "ebpf");
            let iptables = rate(most, "ebpf") / rate(most, "iptables");
            let nftables = rate(most, "ebpf") / rate(most, "nftables");
            let _ = write!(
                out,
                " NodePort from outside the cluster, backend on the other node: flatnet at {} \
                 NodePort Services was {itself:.2}x of itself at {} (target: flat, within 5%, \
                 {}), {iptables:.2}x kube-proxy's iptables mode and {nftables:.2}x its nftables \
                 mode (target: at least 1.2x nftables, {}).",
                most["services"],
                fewest["services"],
                verdict(itself >= 0.95),
                verdict(nftables >= 1.2),
            );
        }
        out
    }

    fn services_tables(&self) -> String {
        self.services
            .as_ref()
            .map(super::socket_services::table)
            .unwrap_or_default()
    }

    fn overlay(&self) -> String {
        let Some(overlay) = &self.overlay else {
            return "No overlay run in `results/` (overlay.json is missing).\n".into();
        };
        format!(
            "{}, commit {}; {} round(s), {} s per measurement.\n\n{}",
            overlay["date"].as_str().unwrap_or("?"),
            overlay["commit"].as_str().unwrap_or("?"),
            overlay["rounds"],
            overlay["seconds"],
            super::overlay::table(overlay)
        )
    }

    fn cri(&self) -> String {
        let Some(cri) = &self.cri else {
            return "No RunPodSandbox run in `results/` (cri.json is missing).".into();
        };
        let flatnet = field(cri, "flatnet_median_ms");
        let bridge = field(cri, "bridge_median_ms");
        format!(
            "RunPodSandbox under {}, the same containerd for both, median of {}: flatnet \
             {flatnet:.2} ms, bridge + host-local {bridge:.2} ms ({:.2}x).",
            cri["runtime"].as_str().unwrap_or("containerd"),
            cri["runs"],
            flatnet / bridge
        )
    }

    fn program_cost(&self) -> String {
        match &self.program_cost {
            Some(cost) => super::program_cost::table(cost),
            None => "No program cost run in `results/` (program-cost.json is missing).\n".into(),
        }
    }

    fn e2e(&self) -> String {
        if self.e2e.is_empty() {
            return "No e2e run in `results/` (no e2e-<mode>.json).\n".into();
        }
        let mut out = String::new();
        for report in &self.e2e {
            let _ = writeln!(
                out,
                "- {}: {}",
                report["mode"].as_str().unwrap_or("?"),
                report["run"].as_str().unwrap_or("?")
            );
        }
        out.push_str(
            "\n| Services | suite | ran | passed | failed | skipped at run time | time |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for report in &self.e2e {
            let mode = report["mode"].as_str().unwrap_or("?");
            for suite in report["suites"].as_array().cloned().unwrap_or_default() {
                let specs = suite["specs"].as_array().cloned().unwrap_or_default();
                let outcomes = |outcome: &str| {
                    specs
                        .iter()
                        .filter(|s| s["outcome"].as_str() == Some(outcome))
                        .count()
                };
                let (passed, failed) = (outcomes("passed"), outcomes("failed"));
                let _ = writeln!(
                    out,
                    "| {mode} | {} | {} | {passed} | {failed} | {} | {:.0} s |",
                    suite["suite"].as_str().unwrap_or("?"),
                    passed + failed,
                    outcomes("skipped"),
                    field(&suite, "seconds"),
                );
            }
        }
        out.push('\n');
        for report in &self.e2e {
            let probe = &report["first_packet"];
            if probe.is_object() {
                let _ = writeln!(
                    out,
                    "flatnet's first-packet check, {}: {} of {} tries (every 100 ms from the \
                     container's start) through a deny-all-egress policy; through {:.1} s after \
                     the policy was deleted.",
                    report["mode"].as_str().unwrap_or("?"),
                    probe["through"],
                    probe["tries"],
                    field(probe, "opened_after_seconds"),
                );
            }
        }
        out
    }

    /// docs/benchmarks.md, whole.
    pub fn page(&self) -> anyhow::Result<String> {
        let values = [
            ("run", self.run_line()),
            ("main_table", self.main_table()),
            ("policy_table", report::policy_table(&self.rounds)),
            (
                "before_after",
                format!(
                    "Earlier build: {}.\n\n{}",
                    self.config
                        .before
                        .as_deref()
                        .map_or("none in this run".to_string(), |c| format!("commit {c}")),
                    super::before::table(&self.rounds)
                ),
            ),
            ("variants", super::variants::table(&self.rounds)),
            ("services_summary", self.services_summary()),
            ("services_tables", self.services_tables()),
            ("overlay", self.overlay()),
            ("cri", self.cri()),
            ("program_cost", self.program_cost()),
            ("e2e", self.e2e()),
        ];
        fill(TEMPLATE, &values)
    }

    /// What goes between the README's markers: the run and the headline table.
    pub fn readme_section(&self) -> String {
        format!("{}\n\n{}", self.run_line(), self.main_table())
    }
}

/// `template` with each `{{name}}` replaced by its value; a placeholder
/// without a value is an error (a typo in the template must not ship).
fn fill(template: &str, values: &[(&str, String)]) -> anyhow::Result<String> {
    let mut out = template.to_string();
    for (name, value) in values {
        out = out.replace(&format!("{{{{{name}}}}}"), value);
    }
    if let Some(start) = out.find("{{") {
        let rest = &out[start..];
        let name = rest.split("}}").next().unwrap_or(rest);
        bail!("benchmarks.template.md: no value for the placeholder {name}}}}}");
    }
    Ok(out)
}

/// The README's generated section.
const README_TABLE: Section = Section {
    page: "the README",
    what: "the benchmark table",
    start: TABLE_START,
    end: TABLE_END,
};

/// `readme` with what lies between its markers replaced by `section`;
/// everything outside them is kept byte for byte.
pub fn replace_section(readme: &str, section: &str) -> anyhow::Result<String> {
    README_TABLE.replace(readme, &format!("{}\n", section.trim_end()))
}

/// Writes `<root>/docs/benchmarks.md` and the README's section from
/// `<root>/results/`.
pub fn write(root: &Path) -> anyhow::Result<()> {
    let results = Results::read(&root.join("results"))?;
    let page = results.page()?;
    let docs = root.join("docs");
    std::fs::create_dir_all(&docs)?;
    std::fs::write(docs.join("benchmarks.md"), page)?;
    let readme_path = root.join("README.md");
    let readme = std::fs::read_to_string(&readme_path)
        .with_context(|| format!("reading {}", readme_path.display()))?;
    let updated = replace_section(&readme, &results.readme_section())?;
    std::fs::write(&readme_path, updated)?;
    println!(
        "wrote {} and the README's benchmark table from {}",
        docs.join("benchmarks.md").display(),
        root.join("results").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One round, every path, round numbers: easy to check by eye.
    fn fixture_bench() -> String {
        let sample = |tcp: f64, program: Option<f64>| {
            serde_json::json!({
                "tcp_gbps": tcp, "rr_p50_us": 10.0, "rr_p99_us": 12.0, "udp_kpps": 200.0,
                "clusterip_rr_p50_us": null, "program_ns": program, "program_tcp_ns": program,
            })
        };
        let times = |ms: f64| {
            serde_json::json!({
                "add_sequential_ms": ms, "del_sequential_ms": ms, "add_concurrent_ms_per_pod": ms,
                "del_concurrent_ms_per_pod": ms, "ipam_add_sequential_ms": ms,
                "ipam_add_concurrent_ms_per_pod": ms,
            })
        };
        serde_json::json!({
            "run": {"date": "2030-01-02 03:04 UTC", "commit": "abc1234", "machine": "2 cores",
                    "rounds": 1, "seconds": 3, "sequential": 50, "concurrent": 32,
                    "flatnet_ipam": "flatnet-ipam"},
            "rounds": [{
                "data": {"bridge": sample(10.0, None), "flatnet": sample(20.0, Some(300.0)),
                         "flatnet-xdp": sample(4.0, Some(310.0)), "veth": sample(16.0, None),
                         "veth-big": sample(20.0, None),
                         "flatnet-policy": sample(19.0, Some(400.0))},
                "cni": {"bridge": times(10.0), "flatnet": times(4.0), "flatnet-nofsync": times(3.0)},
            }],
        })
        .to_string()
    }

    #[test]
    fn a_fixture_gives_its_table() -> anyhow::Result<()> {
        let results = Results::parse(&fixture_bench(), None, None, None, None, &[])?;
        let section = results.readme_section();
        assert!(section.starts_with(
            "2030-01-02 03:04 UTC, commit abc1234; 2 cores; 1 interleaved round(s), 3 s per data-plane measurement.\n\n| metric | bridge |"
        ));
        for row in [
            "| TCP throughput, 1 stream (Gbit/s) | 10.00 | 20.00 | 4.00 | 16.00 | 20.00 | 2.00 | 1.25 | 1.00 | 0.40 | bridge >= 1, veth >= 1.1, veth BIG TCP >= 0.97 | met |",
            "| CNI ADD, 50 one after another (ms/pod) | 10.00 | 4.00 | - | - | - | 0.40 | - | - | - | bridge <= 0.5 | met |",
            "| IPAM alone, flatnet-ipam with \"fsync\": false: ADD, 64 at once (ms/pod) | 10.00 | 3.00 | - | - | - | 0.30 | - | - | - | bridge <= 0.5 | met |",
        ] {
            assert!(section.contains(row), "{row}\nnot in\n{section}");
        }
        let page = results.page()?;
        assert!(
            page.contains("| TCP throughput (Gbit/s) | 20.00 | 19.00 | 0.95 | >= 0.95 | met |")
        );
        assert!(page.contains("services.json is missing"));
        assert!(!page.contains("{{"));
        Ok(())
    }

    #[test]
    fn marker_replacement_is_idempotent_and_keeps_the_rest() -> anyhow::Result<()> {
        let readme = format!("# t\n\nbefore\n{TABLE_START}\nold table\n{TABLE_END}\n\nafter\n");
        let once = replace_section(&readme, "new table\n")?;
        assert_eq!(
            once,
            format!("# t\n\nbefore\n{TABLE_START}\nnew table\n{TABLE_END}\n\nafter\n")
        );
        assert_eq!(replace_section(&once, "new table\n")?, once);
        Ok(())
    }

    #[test]
    fn missing_markers_are_a_clear_error() {
        for readme in [
            "no markers".to_string(),
            format!("{TABLE_START}\nonly the start\n"),
            format!("{TABLE_END}\nreversed\n{TABLE_START}\n"),
        ] {
            let error = match replace_section(&readme, "table") {
                Ok(_) => panic!("accepted {readme:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                error.contains(TABLE_START) && error.contains(TABLE_END),
                "{error}"
            );
        }
    }

    #[test]
    fn an_unfilled_placeholder_is_an_error() {
        let error = fill("a {{known}} b {{unknown}} c", &[("known", "x".into())])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("{{unknown}}"), "{error}");
    }

    /// The committed page and README section are exactly what the generator
    /// writes from the committed results/: a hand edit fails here.
    #[test]
    fn committed_docs_match_the_committed_results() -> anyhow::Result<()> {
        let root = crate::util::root();
        let results = Results::read(&root.join("results"))?;
        let page = std::fs::read_to_string(root.join("docs/benchmarks.md"))?;
        assert!(
            page == results.page()?,
            "docs/benchmarks.md differs from what `cargo xtask docs` writes from results/: edit xtask/src/bench/benchmarks.template.md, then run `cargo xtask docs`"
        );
        let readme = std::fs::read_to_string(root.join("README.md"))?;
        assert!(
            readme == replace_section(&readme, &results.readme_section())?,
            "the README's benchmark table differs from what `cargo xtask docs` writes from results/: run `cargo xtask docs`"
        );
        Ok(())
    }
}

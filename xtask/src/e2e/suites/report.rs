//! The suites' results, read back and reported: the JUnit reports (what
//! passed, failed and with which message, what skipped itself and why), the
//! summary printed after a run, `results/` written after a `--full` one,
//! and the run's verdict.

use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::super::cluster::ServicesMode;
use super::catalog::{COMMON_SKIPS, IPV4_ONLY_SKIPS, SUITES};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Passed,
    Failed,
    Skipped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpecResult {
    pub name: String,
    pub outcome: Outcome,
    pub seconds: f64,
    /// The failure's or the skip's message.
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuiteReport {
    pub suite: String,
    pub seconds: f64,
    pub specs: Vec<SpecResult>,
}

impl SuiteReport {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.specs.iter().filter(|s| s.outcome == outcome).count()
    }

    /// `| mode | suite | ran | passed | failed | skipped at run time | time |`
    pub fn row(&self, mode: &str) -> String {
        format!(
            "| {mode} | {} | {} | {} | {} | {} | {:.0} s |",
            self.suite,
            self.count(Outcome::Passed) + self.count(Outcome::Failed),
            self.count(Outcome::Passed),
            self.count(Outcome::Failed),
            self.count(Outcome::Skipped),
            self.seconds
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModeReport {
    pub mode: String,
    pub suites: Vec<SuiteReport>,
    /// flatnet's first-packet check (first_packet.rs).
    #[serde(default)]
    pub first_packet: Option<FirstPacketReport>,
    /// STATUS through containerd with the agent away (runtime_status.rs).
    #[serde(default)]
    pub runtime_status: Option<RuntimeStatusReport>,
    /// Requests of flatnet's agents and the cluster DNS the API server
    /// audited (none of them to a deprecated API).
    #[serde(default)]
    pub audited_requests: usize,
    /// When, at which commit and with which build this mode ran (results/
    /// keeps each mode's latest run, so the two may differ).
    #[serde(default)]
    pub run: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuntimeStatusReport {
    pub node: String,
    pub message: String,
    pub not_ready_after_seconds: f64,
    pub ready_again_after_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FirstPacketReport {
    pub tries: usize,
    pub through: usize,
    pub opened_after_seconds: f64,
}

/// Every spec of the reports ginkgo's nodes wrote (`junit_*.xml`);
/// [`selected`] leaves out those the run did not select.
pub fn read_junit(dir: &Path) -> anyhow::Result<Vec<SpecResult>> {
    let mut specs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !(name.starts_with("junit") && name.ends_with(".xml")) {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        specs.extend(parse_junit(&text).with_context(|| format!("reading {}", path.display()))?);
    }
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(specs)
}

/// The specs the run selected: ginkgo v2 lists every spec a focus or a
/// skip left out as skipped in 0 s with the message "skipped" alone (a
/// spec that skips itself says why).
pub fn selected(specs: Vec<SpecResult>) -> Vec<SpecResult> {
    specs
        .into_iter()
        .filter(|s| !(s.outcome == Outcome::Skipped && s.seconds == 0.0 && s.message == "skipped"))
        .collect()
}

/// ginkgo's suite-level nodes, as its JUnit report names them.
const SUITE_NODES: &[&str] = &[
    "[BeforeSuite]",
    "[SynchronizedBeforeSuite]",
    "[ReportBeforeSuite]",
    "[AfterSuite]",
    "[SynchronizedAfterSuite]",
    "[ReportAfterSuite]",
    "[DeferCleanup (Suite)]",
];

fn parse_junit(text: &str) -> anyhow::Result<Vec<SpecResult>> {
    let document = roxmltree::Document::parse(text)?;
    let mut specs = Vec::new();
    for case in document
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
    {
        // ginkgo v2 names a spec by its node: "[It] [sig-network] ...".
        let full_name = case.attribute("name").unwrap_or_default();
        let name = full_name
            .strip_prefix("[It] ")
            .unwrap_or(full_name)
            .to_string();
        let seconds: f64 = case
            .attribute("time")
            .and_then(|t| t.parse().ok())
            .unwrap_or(0.0);
        let child = |tag: &str| case.children().find(|c| c.has_tag_name(tag));
        // ginkgo v2 leaves a failure's `message` empty and writes the
        // text in the element's body.
        let message = |node: roxmltree::Node| {
            node.attribute("message")
                .filter(|m| !m.trim().is_empty())
                .map(str::to_string)
                .or_else(|| node.text().map(str::to_string))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let (outcome, message) = if let Some(failure) = child("failure").or_else(|| child("error"))
        {
            (Outcome::Failed, message(failure))
        } else if let Some(skipped) = child("skipped") {
            let text = message(skipped);
            if seconds == 0.0 && text.is_empty() {
                // Not selected by the focus (ginkgo v1).
                continue;
            }
            (Outcome::Skipped, text)
        } else {
            (Outcome::Passed, String::new())
        };
        // ginkgo's own suite-level entries (before and after the suite, its
        // reporters): only a failed one says anything about the run.
        let suite_node = SUITE_NODES.iter().any(|node| name.starts_with(node));
        if name.is_empty() || suite_node && outcome == Outcome::Passed {
            continue;
        }
        specs.push(SpecResult {
            name,
            outcome,
            seconds,
            message,
        });
    }
    Ok(specs)
}

pub fn print_summary(reports: &[ModeReport]) {
    println!("\n| Services | suite | ran | passed | failed | skipped at run time | time |");
    println!("|---|---|---|---|---|---|---|");
    for report in reports {
        for suite in &report.suites {
            println!("{}", suite.row(&report.mode));
        }
    }
    for report in reports {
        if let Some(probe) = &report.first_packet {
            println!(
                "first packet ({}): {} of {} tries through under the policy; through {:.1} s after it was deleted",
                report.mode, probe.through, probe.tries, probe.opened_after_seconds
            );
        }
        for suite in &report.suites {
            for spec in suite.specs.iter().filter(|s| s.outcome == Outcome::Failed) {
                println!(
                    "FAILED ({}, {}): {}\n    {}",
                    report.mode,
                    suite.suite,
                    spec.name,
                    spec.message.lines().next().unwrap_or_default()
                );
            }
        }
    }
}

/// `results/e2e.md` and `results/e2e-<mode>.json` after a `--full` run:
/// per mode and suite what ran, passed, failed and skipped itself, every
/// skip (by expression, and at run time with its message) with its
/// reason, every failure with its first line.
/// A mode run alone keeps the other mode's last full report.
pub fn write_results(reports: &[ModeReport], dir: &Path, run: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for report in reports {
        let report = ModeReport {
            run: run.to_string(),
            ..report.clone()
        };
        std::fs::write(
            dir.join(format!("e2e-{}.json", report.mode)),
            serde_json::to_string_pretty(&report)?,
        )?;
    }
    let mut reports = Vec::new();
    for name in ServicesMode::ALL
        .iter()
        .flat_map(|mode| [false, true].map(|dual| mode.run_name(dual)))
    {
        let path = dir.join(format!("e2e-{name}.json"));
        if let Ok(text) = std::fs::read_to_string(&path) {
            let report: ModeReport = serde_json::from_str(&text)
                .with_context(|| format!("reading {}", path.display()))?;
            reports.push(report);
        }
    }
    let reports = &reports;
    let mut md = String::from("# flatnet on real Kubernetes: upstream e2e results\n\n");
    for report in reports {
        md.push_str(&format!("- {}: {}\n", report.mode, report.run));
    }
    md.push_str(
        "\n| Services | suite | ran | passed | failed | skipped at run time | time |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for report in reports {
        for suite in &report.suites {
            md.push_str(&suite.row(&report.mode));
            md.push('\n');
        }
    }
    md.push_str("\n## flatnet's first-packet check\n\n");
    for report in reports {
        if let Some(probe) = &report.first_packet {
            md.push_str(&format!(
                "- {}: {} of {} tries (every 100 ms from the container's start) through a deny-all-egress policy; through {:.1} s after the policy was deleted\n",
                report.mode, probe.through, probe.tries, probe.opened_after_seconds
            ));
        }
    }
    md.push_str("\n## Skipped before they run (ginkgo `--skip`), and why\n\n| specs matching | modes | why |\n|---|---|---|\n");
    for (pattern, why) in COMMON_SKIPS {
        md.push_str(&format!("| `{pattern}` | all | {why} |\n"));
    }
    for (pattern, why) in IPV4_ONLY_SKIPS {
        md.push_str(&format!(
            "| `{pattern}` | all, IPv4-only clusters | {why} |\n"
        ));
    }
    // A mode's skips hold for its serial suite too: one row per pattern,
    // naming every mode it is skipped in.
    let mut mode_skips: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    for suite in SUITES.iter().filter(|s| !s.in_ci) {
        for &(pattern, why) in suite.skips {
            let at = match mode_skips
                .iter()
                .position(|(p, w, _)| (*p, *w) == (pattern, why))
            {
                Some(at) => at,
                None => {
                    mode_skips.push((pattern, why, Vec::new()));
                    mode_skips.len() - 1
                }
            };
            for mode in suite.modes.iter().map(|m| m.name()) {
                if !mode_skips[at].2.contains(&mode) {
                    mode_skips[at].2.push(mode);
                }
            }
        }
    }
    for (pattern, why, modes) in mode_skips {
        md.push_str(&format!("| `{pattern}` | {} | {why} |\n", modes.join(", ")));
    }
    md.push_str("\n## Skipped at run time by the suite itself\n\n| Services | spec | message |\n|---|---|---|\n");
    for report in reports {
        for suite in &report.suites {
            for spec in suite.specs.iter().filter(|s| s.outcome == Outcome::Skipped) {
                md.push_str(&format!(
                    "| {} | {} | {} |\n",
                    report.mode,
                    spec.name,
                    first_line(&spec.message)
                ));
            }
        }
    }
    md.push_str("\n## Failed\n\n");
    let mut any = false;
    for report in reports {
        for suite in &report.suites {
            for spec in suite.specs.iter().filter(|s| s.outcome == Outcome::Failed) {
                any = true;
                md.push_str(&format!(
                    "- {} ({}): {}\n",
                    spec.name,
                    report.mode,
                    first_line(&spec.message)
                ));
            }
        }
    }
    if !any {
        md.push_str("None.\n");
    }
    std::fs::write(dir.join("e2e.md"), md)?;
    Ok(())
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .replace('|', "\\|")
}

/// An error when any spec failed or a suite ran nothing.
pub fn verdict(reports: &[ModeReport]) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for report in reports {
        if let Some(probe) = &report.first_packet
            && probe.through > 0
        {
            problems.push(format!(
                "{} of {} first-packet tries got through a deny-all-egress policy ({})",
                probe.through, probe.tries, report.mode
            ));
        }
        for suite in &report.suites {
            let failed = suite.count(Outcome::Failed);
            if failed > 0 {
                problems.push(format!(
                    "{} failed in {} ({})",
                    failed, suite.suite, report.mode
                ));
            }
            if suite.count(Outcome::Passed) == 0 {
                problems.push(format!("{} ({}) passed nothing", suite.suite, report.mode));
            }
        }
    }
    if !problems.is_empty() {
        bail!("e2e: {}", problems.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_cases_are_read_and_unselected_ones_left_out() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="Kubernetes e2e suite" tests="4" failures="1" errors="0" time="50">
  <testcase name="[sig-network] a passes" classname="Kubernetes e2e suite" time="12.5"></testcase>
  <testcase name="[sig-network] b fails" classname="Kubernetes e2e suite" time="30">
    <failure type="Failure">boom
more</failure>
  </testcase>
  <testcase name="[sig-network] c needs two nodes" classname="Kubernetes e2e suite" time="3.2"><skipped message="Requires at least 2 nodes"></skipped></testcase>
  <testcase name="[sig-storage] d not selected" classname="Kubernetes e2e suite" time="0"><skipped></skipped></testcase>
</testsuite>"#;
        let specs = parse_junit(xml).unwrap();
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[0].outcome, Outcome::Passed);
        assert_eq!(specs[1].outcome, Outcome::Failed);
        assert!(specs[1].message.starts_with("boom"));
        assert_eq!(specs[2].outcome, Outcome::Skipped);
        assert_eq!(specs[2].message, "Requires at least 2 nodes");
    }

    #[test]
    fn ginkgo_v2_reports_name_specs_by_node_and_list_the_suites_nodes() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite">
  <testcase name="[ReportBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
  <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.2"></testcase>
  <testcase name="[It] [sig-network] a passes" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
  <testcase name="[It] [sig-network] b skips itself" classname="Kubernetes e2e suite" status="skipped" time="0.4"><skipped message="skipped - Requires at least 2 nodes"></skipped></testcase>
  <testcase name="[It] [sig-storage] c not selected" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
  <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
  <testcase name="[It] [sig-network] d times out" classname="Kubernetes e2e suite" status="failed" time="300"><failure message="" type="failed">[FAILED] Timed out after 300.001s.&#xA;expected pod to be running</failure></testcase>
  <testcase name="[SynchronizedAfterSuite]" classname="Kubernetes e2e suite" status="failed" time="3"><failure message="cleanup failed"></failure></testcase>
</testsuite></testsuites>"#;
        let specs = selected(parse_junit(xml).unwrap());
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "[sig-network] a passes",
                "[sig-network] b skips itself",
                "[sig-network] d times out",
                "[SynchronizedAfterSuite]"
            ]
        );
        assert_eq!(specs[1].outcome, Outcome::Skipped);
        assert_eq!(specs[2].outcome, Outcome::Failed);
        assert_eq!(
            first_line(&specs[2].message),
            "[FAILED] Timed out after 300.001s."
        );
        assert_eq!(specs[3].outcome, Outcome::Failed);
        assert_eq!(specs[3].message, "cleanup failed");
    }
}

//! critest's results, read and written: its JUnit report read with the e2e
//! suite's reader, the specs this run skips (each with its reason), the
//! groups of the table (the networking specs, then the rest) and
//! `results/critest.md`.

use std::fmt::Write as _;
use std::path::Path;

use super::super::suites::{Outcome, SpecResult, read_junit};

/// Specs left out on purpose (a ginkgo `--skip` pattern, and why).
pub const SKIPS: &[(&str, &str)] = &[(
    "public image with digest should be pulled and removed",
    "asks for `test-image-digest` by upstream's manifest digest (sha256:9700f9a2...): no stand-in can have that digest, and nothing can be pulled from upstream",
)];

/// Why a spec is known to fail here (a pattern of its name, and why),
/// added to critest's own message in the report.
pub const KNOWN: &[(&str, &str)] = &[(
    "runtime should support MaskedPaths",
    "known: the stand-in busybox is Debian's busybox-static, whose applets are symlinks to one binary (masking /bin/ls masks busybox itself, so no shell starts) and whose sh runs applets in-process; upstream's busybox has hardlinks and an sh that execs `ls`",
)];

/// The groups of the table, in order: a spec is in the first whose
/// patterns one of is in its name; the last takes the rest.
pub const GROUPS: &[(&str, &[&str])] = &[
    (
        "DNS config and hostname",
        &["support DNS config", "support set hostname"],
    ),
    ("port mapping (portmap)", &["port mapping"]),
    ("host network", &["HostNetwork", "in host network"]),
    (
        "pod IPs (HTTP to the pod's address)",
        &["in a pod should support network"],
    ),
    ("port forward", &["support portforward"]),
    ("everything else", &[]),
];

/// Networking groups: all but the last.
fn group_of(name: &str) -> usize {
    GROUPS
        .iter()
        .position(|(_, patterns)| patterns.iter().any(|p| name.contains(p)))
        .unwrap_or(GROUPS.len() - 1)
}

/// The ginkgo `--skip` expression of [`SKIPS`].
pub fn skip_expression() -> String {
    SKIPS
        .iter()
        .map(|(pattern, _)| regex_escape(pattern))
        .collect::<Vec<_>>()
        .join("|")
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// One spec as the table counts it.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Without ginkgo's `[It] ` (node type) prefix.
    pub name: String,
    pub outcome: Outcome,
    pub seconds: f64,
    /// The failure's, the run-time skip's or [`SKIPS`]'s reason.
    pub reason: String,
}

/// The specs of ginkgo's JUnit reports in `dir`: suite set-up entries
/// left out, specs skipped by [`SKIPS`] given its reason, and specs a
/// `--focus` left out (skipped, message only "skipped", matching no
/// [`SKIPS`]) dropped.
pub fn read(dir: &Path) -> anyhow::Result<Vec<Spec>> {
    Ok(from_results(read_junit(dir)?))
}

fn from_results(results: Vec<SpecResult>) -> Vec<Spec> {
    results
        .into_iter()
        .filter_map(|result| {
            let name = result
                .name
                .strip_prefix("[It] ")
                .unwrap_or(&result.name)
                .to_string();
            if name.starts_with('[')
                && [
                    "[BeforeSuite]",
                    "[AfterSuite]",
                    "[ReportAfterSuite]",
                    "[DeferCleanup",
                ]
                .iter()
                .any(|p| name.starts_with(p))
                && result.outcome == Outcome::Passed
            {
                return None;
            }
            let reason = match result.outcome {
                Outcome::Skipped if result.message == "skipped" && name.contains(" benchmark ") => {
                    "a benchmark: critest skips its benchmarks unless run with -benchmark"
                        .to_string()
                }
                Outcome::Skipped if result.message == "skipped" => {
                    let (_, why) = SKIPS.iter().find(|(p, _)| name.contains(p))?;
                    format!("skipped by `cargo xtask critest`: {why}")
                }
                Outcome::Failed => match KNOWN.iter().find(|(p, _)| name.contains(p)) {
                    Some((_, why)) => format!("{} ({why})", first_line(&result.message)),
                    None => result.message,
                },
                Outcome::Skipped => result.message.trim_start_matches("skipped - ").to_string(),
                _ => result.message,
            };
            Some(Spec {
                name,
                outcome: result.outcome,
                seconds: result.seconds,
                reason,
            })
        })
        .collect()
}

fn counts(specs: &[&Spec]) -> (usize, usize, usize, usize) {
    let count = |o: Outcome| specs.iter().filter(|s| s.outcome == o).count();
    let (passed, failed, skipped) = (
        count(Outcome::Passed),
        count(Outcome::Failed),
        count(Outcome::Skipped),
    );
    (passed + failed, passed, failed, skipped)
}

/// The table: one row per group, then the networking total and the total.
pub fn table(specs: &[Spec]) -> String {
    let mut text =
        String::from("| group | ran | passed | failed | skipped |\n|---|---|---|---|---|\n");
    let row = |text: &mut String, label: &str, specs: &[&Spec]| {
        let (ran, passed, failed, skipped) = counts(specs);
        let _ = writeln!(
            text,
            "| {label} | {ran} | {passed} | {failed} | {skipped} |"
        );
    };
    for (index, (label, _)) in GROUPS.iter().enumerate() {
        let in_group: Vec<&Spec> = specs
            .iter()
            .filter(|s| group_of(&s.name) == index)
            .collect();
        if index == GROUPS.len() - 1 {
            let networking: Vec<&Spec> = specs
                .iter()
                .filter(|s| group_of(&s.name) < GROUPS.len() - 1)
                .collect();
            row(&mut text, "**networking, all**", &networking);
        }
        row(&mut text, label, &in_group);
    }
    let all: Vec<&Spec> = specs.iter().collect();
    row(&mut text, "**all**", &all);
    text
}

/// The first non-empty line of `text`.
fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(no message)")
}

/// The first line of a reason, cut to a readable length, for a table cell.
fn short(reason: &str) -> String {
    let line = first_line(reason);
    let cut: String = line.chars().take(600).collect();
    let cut = if cut.len() < line.len() {
        format!("{cut}...")
    } else {
        cut
    };
    cut.replace('|', "\\|")
}

/// `results/critest.md`: `header`, the table, then every failure and
/// every skip with its reason.
pub fn markdown(header: &str, specs: &[Spec]) -> String {
    let mut text =
        format!("# critest (cri-tools' CRI validation) on containerd with flatnet\n\n{header}\n\n");
    text.push_str(&table(specs));
    for (title, outcome) in [("Failed", Outcome::Failed), ("Skipped", Outcome::Skipped)] {
        let listed: Vec<&Spec> = specs.iter().filter(|s| s.outcome == outcome).collect();
        if listed.is_empty() {
            continue;
        }
        let _ = write!(
            text,
            "\n## {title} ({})\n\n| spec | group | why |\n|---|---|---|\n",
            listed.len()
        );
        for spec in listed {
            let _ = writeln!(
                text,
                "| {} | {} | {} |",
                spec.name.replace('|', "\\|"),
                GROUPS[group_of(&spec.name)].0,
                short(&spec.reason)
            );
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const JUNIT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="0" errors="0" failures="1" time="9.1">
  <testsuite name="CRI validation" package="/x" tests="5" disabled="0" skipped="2" errors="0" failures="1" time="9.1">
    <testcase name="[BeforeSuite]" classname="CRI validation" status="passed" time="0.01"></testcase>
    <testcase name="[It] [k8s.io] Networking runtime should support networking runtime should support DNS config [Conformance]" classname="CRI validation" status="passed" time="2.5"></testcase>
    <testcase name="[It] [k8s.io] Networking runtime should support networking runtime should support port mapping with host port and container port [Conformance]" classname="CRI validation" status="failed" time="61.0">
      <failure message="Timed out after 60.001s.&#xA;Expected success" type="failed">[FAILED] Timed out</failure>
    </testcase>
    <testcase name="[It] [k8s.io] AppArmor runtime should support apparmor field should enforce a permissive deprecated profile" classname="CRI validation" status="skipped" time="0.02">
      <skipped message="skipped - AppArmor is disabled on this host"></skipped>
    </testcase>
    <testcase name="[It] [k8s.io] Image Manager public image with digest should be pulled and removed [Conformance] [Serial]" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [k8s.io] Streaming runtime should support streaming interfaces runtime should support portforward in host network" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [k8s.io] Image benchmark about operations on Image benchmark about listing Image" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [k8s.io] Security Context bucket runtime should support MaskedPaths" classname="CRI validation" status="failed" time="1.2">
      <failure message="failed to start container" type="failed">[FAILED] failed to start container</failure>
    </testcase>
  </testsuite>
</testsuites>"#;

    fn specs() -> Vec<Spec> {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "flatnet-critest-junit-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("junit_critest.xml"), JUNIT).unwrap();
        let specs = read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        specs
    }

    #[test]
    fn junit_specs_with_reasons_and_without_focus_leftovers() {
        let specs = specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(specs.len(), 6, "{names:?}");
        let benchmark = specs.iter().find(|s| s.name.contains("benchmark")).unwrap();
        assert!(benchmark.reason.contains("-benchmark"), "{benchmark:?}");
        let masked = specs
            .iter()
            .find(|s| s.name.contains("MaskedPaths"))
            .unwrap();
        assert!(
            masked
                .reason
                .starts_with("failed to start container (known: ")
        );
        assert!(
            names
                .iter()
                .all(|n| !n.starts_with("[It]") && !n.starts_with("[BeforeSuite]"))
        );
        let apparmor = specs.iter().find(|s| s.name.contains("AppArmor")).unwrap();
        assert_eq!(apparmor.reason, "AppArmor is disabled on this host");
        let digest = specs.iter().find(|s| s.name.contains("digest")).unwrap();
        assert_eq!(digest.outcome, Outcome::Skipped);
        assert!(
            digest
                .reason
                .starts_with("skipped by `cargo xtask critest`: asks for")
        );
        // Left out by a focus: not counted at all.
        assert!(
            !names
                .iter()
                .any(|n| n.contains("portforward in host network"))
        );
    }

    #[test]
    fn the_table_groups_networking_specs() {
        let table = table(&specs());
        assert!(
            table.contains("| DNS config and hostname | 1 | 1 | 0 | 0 |"),
            "{table}"
        );
        assert!(
            table.contains("| port mapping (portmap) | 1 | 0 | 1 | 0 |"),
            "{table}"
        );
        assert!(
            table.contains("| **networking, all** | 2 | 1 | 1 | 0 |"),
            "{table}"
        );
        assert!(
            table.contains("| everything else | 1 | 0 | 1 | 3 |"),
            "{table}"
        );
        assert!(table.contains("| **all** | 3 | 1 | 2 | 3 |"), "{table}");
        let md = markdown("header", &specs());
        assert!(md.contains("## Failed (2)"), "{md}");
        assert!(
            md.contains("| port mapping (portmap) | Timed out after 60.001s. |"),
            "{md}"
        );
        assert!(md.contains("## Skipped (3)"));
    }

    #[test]
    fn groups_and_skip_patterns() {
        assert_eq!(
            group_of(
                "[k8s.io] Security Context NamespaceOption runtime should support HostNetwork is true"
            ),
            2
        );
        assert_eq!(
            group_of(
                "[k8s.io] Multiple Containers [Conformance] when running multiple containers in a pod should support network"
            ),
            3
        );
        assert_eq!(
            group_of(
                "[k8s.io] Multiple Containers [Conformance] when running multiple containers in a pod should support container log"
            ),
            5
        );
        assert_eq!(
            skip_expression(),
            "public image with digest should be pulled and removed"
        );
        assert_eq!(regex_escape("a [b] c.d"), "a \\[b\\] c\\.d");
    }
}

//! The upstream e2e suites of the same release (e2e.test + ginkgo, built
//! from the same source), run from the control plane machine against the
//! cluster, and their JUnit reports read back: what ran, what passed, what
//! failed and with which message, what skipped itself and why.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::E2eArgs;
use super::build::Built;
use super::cluster::{Cluster, ServicesMode};
use super::plan;

/// A set of specs chosen by ginkgo's focus and skip expressions.
pub struct Suite {
    pub name: &'static str,
    pub focus: &'static str,
    /// Specs of the focus this cluster cannot run, and why (docs/kubernetes.md).
    pub skips: &'static [(&'static str, &'static str)],
    /// Run in CI (`cargo xtask test`) as well as with `--full`.
    pub in_ci: bool,
    /// Services modes it runs in.
    pub modes: &'static [ServicesMode],
    /// ginkgo's parallel processes (`-nodes`): the specs mostly wait, so
    /// the CI subset runs three at once on two cores, which ends it when
    /// its longest spec (an egress policy, ~2 min) does.
    pub parallel: u8,
    /// Runs `[Serial]` specs: alone on the cluster (one process, after the
    /// suites before it).
    pub serial: bool,
    /// Runs on dual-stack clusters only.
    pub dual_stack_only: bool,
}

/// The `[Serial]` skip of `COMMON_SKIPS`, left out where a suite runs alone.
const SERIAL: &str = r"\[Serial\]";

const EVERY_MODE: &[ServicesMode] = &ServicesMode::ALL;
/// The modes in which kube-proxy runs.
const KUBE_PROXY: &[ServicesMode] = &[ServicesMode::KubeProxy, ServicesMode::KubeProxyNftables];

/// Skips shared by every suite: what no cluster on this machine can do.
pub const COMMON_SKIPS: &[(&str, &str)] = &[
    (
        SERIAL,
        "needs the whole cluster to itself (run by hand with --focus, one process; the host-ports suite runs its spec so)",
    ),
    (r"\[Disruptive\]", "restarts or breaks nodes and components"),
    (r"\[Flaky\]", "marked flaky upstream"),
    (
        r"\[Feature:SCTP\]|\[Feature:SCTPConnectivity\]",
        "SCTP: not built into this kernel",
    ),
    (
        r"\[Feature:Networking-IPv4\]|\[Feature:Networking-IPv6\]|\[Feature:Networking-DNS\]",
        "dials 8.8.8.8, 2001:4860:4860::8888 or google.com: no traffic may leave this machine",
    ),
    (
        r"\[Feature:(Ingress|NEG|kubemci|IngressScale)\]",
        "needs a cloud's L7 load balancer or an ingress controller",
    ),
    (
        r"LoadBalancer service with ESIPP|load balancer cleanup finalizer",
        "waits (15-20 min) for a cloud load balancer's address, which a cluster without a cloud provider never gets (the other LoadBalancer specs skip themselves: provider)",
    ),
    (
        r"\[Feature:Example\]",
        "runs the example applications' images (python, redis), which are not built here",
    ),
];

/// Skipped on an IPv4-only cluster (`--dual-stack` runs them).
pub const IPV4_ONLY_SKIPS: &[(&str, &str)] = &[(
    r"\[Feature:IPv6DualStack\]",
    "need a dual-stack cluster: run with --dual-stack",
)];

/// Specs that need kube-proxy itself, skipped with `--services ebpf`.
/// The NodePort-dialing specs run: they dial from pods and host-network
/// pods, which flatnet's socket programs serve (18 of 18 passed with
/// kube-proxy absent, `--focus` at f761931).
const NEEDS_KUBE_PROXY: &[(&str, &str)] = &[(
    r"kube-proxy urls|KubeProxy should set TCP CLOSE_WAIT timeout",
    "asks kube-proxy itself (its healthz and metrics ports, the conntrack timeouts it sets)",
)];

pub const SUITES: &[Suite] = &[
    // The CI subset: pod to pod on and across nodes, ClusterIP Services
    // through each mode, cluster DNS, and NetworkPolicy in both directions
    // including a client created after its egress policy.
    Suite {
        name: "ci",
        focus: concat!(
            r"\[sig-network\] Networking Granular Checks: Pods should function for intra-pod communication: (http|udp)",
            r"|\[sig-network\] Networking Granular Checks: Services should be able to handle large requests: udp",
            r"|\[sig-network\] Networking Granular Checks: Services should function for client IP based session affinity: http",
            r"|\[sig-network\] Services should serve multiport endpoints from pods",
            r"|\[sig-network\] DNS should provide DNS for services",
            r"|NetworkPolicy between server and client should support a 'default-deny-ingress' policy",
            r"|NetworkPolicy between server and client should enforce egress policy allowing traffic to a server in a different namespace",
        ),
        skips: &[],
        in_ci: true,
        modes: EVERY_MODE,
        parallel: 3,
        serial: false,
        dual_stack_only: false,
    },
    // hostPort by hostIP and protocol, from a host-network pod (curl, nc):
    // portmap's rules with kube-proxy, flatnet's BPF hostPorts without.
    // A scheduling spec, [Serial] for the node labels it sets.
    Suite {
        name: "host-ports",
        focus: r"validates that there is no conflict between pods with same hostPort but different hostIP and protocol",
        skips: &[],
        in_ci: true,
        modes: EVERY_MODE,
        parallel: 1,
        serial: true,
        dual_stack_only: false,
    },
    // Both families on a dual-stack cluster: a pod's two addresses, a
    // Service of both families, and pod to Service over each family.
    Suite {
        name: "dual-stack",
        focus: concat!(
            r"\[Feature:IPv6DualStack\] .*(should be able to reach pod on ipv4 and ipv6 ip",
            r"|should create service with ipv4,v6 cluster ip",
            r"|should function for pod-Service: (http|udp))",
        ),
        skips: &[],
        in_ci: true,
        modes: EVERY_MODE,
        parallel: 3,
        serial: false,
        dual_stack_only: true,
    },
    Suite {
        name: "sig-network",
        focus: r"\[sig-network\]",
        skips: &[],
        in_ci: false,
        modes: KUBE_PROXY,
        parallel: 2,
        serial: false,
        dual_stack_only: false,
    },
    Suite {
        name: "sig-network",
        focus: r"\[sig-network\]",
        skips: NEEDS_KUBE_PROXY,
        in_ci: false,
        modes: &[ServicesMode::Ebpf],
        parallel: 2,
        serial: false,
        dual_stack_only: false,
    },
];

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

pub fn run(cluster: &mut Cluster, args: &E2eArgs, built: &Built) -> anyhow::Result<ModeReport> {
    let mut report = ModeReport {
        mode: cluster.name(),
        suites: Vec::new(),
        first_packet: None,
        runtime_status: None,
        audited_requests: 0,
        run: String::new(),
    };
    let probe = super::first_packet::check(cluster)?;
    println!(
        "e2e: first packet ({}): {} of {} tries from a new pod under a deny-all-egress policy got through; {:.1} s after the policy was deleted they did",
        report.mode, probe.through, probe.tries, probe.opened_after
    );
    report.first_packet = Some(FirstPacketReport {
        tries: probe.tries,
        through: probe.through,
        opened_after_seconds: probe.opened_after,
    });
    let status = super::runtime_status::check(cluster)?;
    println!(
        "e2e: STATUS through containerd ({}): with the agent away {} went NotReady in {:.1} s (\"{}\"), Ready again {:.1} s after it came back",
        report.mode, status.node, status.not_ready_after, status.message, status.ready_again_after
    );
    report.runtime_status = Some(RuntimeStatusReport {
        node: status.node,
        message: status.message,
        not_ready_after_seconds: status.not_ready_after,
        ready_again_after_seconds: status.ready_again_after,
    });
    let chosen: Vec<(String, String, String, u8)> = match &args.focus {
        // By hand, [Serial] specs too: one process.
        Some(focus) => vec![(
            "focus".into(),
            focus.clone(),
            skip_expression(&[], true, cluster.plan.dual_stack),
            1,
        )],
        None => SUITES
            .iter()
            .filter(|s| {
                s.modes.contains(&cluster.mode)
                    && (if args.full { !s.in_ci } else { s.in_ci })
                    && (cluster.plan.dual_stack || !s.dual_stack_only)
            })
            .map(|s| {
                (
                    s.name.to_string(),
                    s.focus.to_string(),
                    skip_expression(s.skips, s.serial, cluster.plan.dual_stack),
                    s.parallel,
                )
            })
            .collect(),
    };
    for (name, focus, skip, parallel) in chosen {
        let started = Instant::now();
        let dir = cluster.logs().join(format!("e2e-{name}"));
        std::fs::create_dir_all(&dir)?;
        run_e2e(cluster, built, &focus, &skip, parallel, &dir)?;
        cluster.check()?;
        let specs = selected(read_junit(&dir)?);
        let suite = SuiteReport {
            suite: name,
            seconds: started.elapsed().as_secs_f64(),
            specs,
        };
        println!("e2e: {}", suite.row(&report.mode));
        report.suites.push(suite);
    }
    // Everything flatnet's agents and the DNS asked during the whole run.
    let audit = super::control_plane::audit_log(&cluster.plan);
    let audited = std::fs::read_to_string(&audit)
        .with_context(|| format!("reading the API server's audit log {}", audit.display()))?;
    let deprecated = deprecated_requests(&audited);
    if !deprecated.is_empty() {
        bail!(
            "flatnet's agents or the cluster DNS asked for deprecated APIs (the API server's audit log {}):\n  {}",
            audit.display(),
            deprecated.join("\n  ")
        );
    }
    println!(
        "e2e: deprecated APIs asked for by flatnet's agents and the cluster DNS: none ({} requests audited)",
        audited.lines().count()
    );
    report.audited_requests = audited.lines().count();
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(cluster.logs().join("report.json"), json)?;
    Ok(report)
}

/// `user: verb uri` of every audited request (flatnet's agents and the
/// cluster DNS, control_plane.rs) the API server marked deprecated.
pub fn deprecated_requests(audit_log: &str) -> Vec<String> {
    let mut found: Vec<String> = audit_log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["annotations"]["k8s.io/deprecated"] == "true")
        .map(|event| {
            format!(
                "{}: {} {}",
                event["user"]["username"].as_str().unwrap_or("?"),
                event["verb"].as_str().unwrap_or("?"),
                event["requestURI"].as_str().unwrap_or("?")
            )
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

fn skip_expression(skips: &[(&str, &str)], serial: bool, dual_stack: bool) -> String {
    let family_skips = if dual_stack { &[][..] } else { IPV4_ONLY_SKIPS };
    COMMON_SKIPS
        .iter()
        .chain(family_skips)
        .chain(skips)
        .map(|(pattern, _)| *pattern)
        .filter(|pattern| !(serial && *pattern == SERIAL))
        .collect::<Vec<_>>()
        .join("|")
}

fn run_e2e(
    cluster: &Cluster,
    built: &Built,
    focus: &str,
    skip: &str,
    parallel: u8,
    report_dir: &Path,
) -> anyhow::Result<()> {
    let host = &cluster.control_plane.host;
    let mut cmd = host.command(built.bin("ginkgo"));
    cmd.arg(format!("--procs={parallel}"))
        // ginkgo v2 ends a suite after an hour unless told otherwise: the
        // full runs take longer.
        .args(["--no-color", "--succinct", "--timeout=24h"])
        .arg(built.bin("e2e.test"))
        .arg("--")
        .arg(format!(
            "--kubeconfig={}",
            cluster.control_plane.admin_kubeconfig.display()
        ))
        .arg(format!("--kubectl-path={}", built.bin("kubectl").display()))
        .arg("--provider=skeleton")
        .arg(format!("--num-nodes={}", cluster.nodes.len()))
        .arg(format!("--dns-domain={}", plan::DNS_DOMAIN))
        .arg(format!("--report-dir={}", report_dir.display()))
        .arg("--disable-log-dump")
        .arg(format!("--ginkgo.focus={focus}"))
        .arg(format!("--ginkgo.skip={skip}"))
        .current_dir(report_dir);
    let log = report_dir.join("e2e.log");
    let mut child = host.spawn(cmd, &log)?;
    let status = child.wait()?;
    // A failed spec makes ginkgo exit non-zero: the report says which.
    if !status.success()
        && std::fs::read_dir(report_dir)?
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with("junit"))
    {
        bail!(
            "e2e.test ran no spec ({status}); the end of {}:\n{}",
            log.display(),
            super::daemon::tail(&log, 40)
        );
    }
    Ok(())
}

/// Every spec of the reports ginkgo's nodes wrote (`junit_*.xml`) that
/// was selected: specs outside the focus are reported as skipped in 0 s
/// with no message, and are left out.
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
        let message = |node: roxmltree::Node| {
            node.attribute("message")
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
    for suite in SUITES.iter().filter(|s| !s.in_ci) {
        for (pattern, why) in suite.skips {
            let modes: Vec<&str> = suite.modes.iter().map(|m| m.name()).collect();
            md.push_str(&format!("| `{pattern}` | {} | {why} |\n", modes.join(", ")));
        }
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
    fn deprecated_requests_are_read_from_the_audit_log() {
        let log = concat!(
            r#"{"verb":"list","requestURI":"/api/v1/endpoints","user":{"username":"system:serviceaccount:kube-system:flatnet-cluster-dns"},"annotations":{"k8s.io/deprecated":"true"}}"#,
            "\n",
            r#"{"verb":"watch","requestURI":"/api/v1/pods","user":{"username":"system:serviceaccount:kube-system:flatnet-agent"},"annotations":{"authorization.k8s.io/decision":"allow"}}"#,
            "\nnot json\n"
        );
        assert_eq!(
            deprecated_requests(log),
            ["system:serviceaccount:kube-system:flatnet-cluster-dns: list /api/v1/endpoints"]
        );
        assert!(deprecated_requests("").is_empty());
    }

    #[test]
    fn a_serial_suite_runs_serial_specs_and_skips_the_rest_as_others_do() {
        let parallel = skip_expression(&[], false, false);
        let serial = skip_expression(&[], true, false);
        assert!(parallel.contains(SERIAL), "{parallel}");
        assert!(!serial.contains(SERIAL), "{serial}");
        assert_eq!(
            parallel.split('|').count(),
            serial.split('|').count() + 1,
            "only [Serial] differs"
        );
        let host_ports = SUITES.iter().find(|s| s.name == "host-ports").unwrap();
        assert!(host_ports.serial && host_ports.in_ci && host_ports.parallel == 1);
    }

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
  <testcase name="[SynchronizedAfterSuite]" classname="Kubernetes e2e suite" status="failed" time="3"><failure message="cleanup failed"></failure></testcase>
</testsuite></testsuites>"#;
        let specs = selected(parse_junit(xml).unwrap());
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "[sig-network] a passes",
                "[sig-network] b skips itself",
                "[SynchronizedAfterSuite]"
            ]
        );
        assert_eq!(specs[1].outcome, Outcome::Skipped);
        assert_eq!(specs[2].outcome, Outcome::Failed);
    }
}

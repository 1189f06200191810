//! The upstream e2e suites of the same release (e2e.test + ginkgo, built
//! from the same source), run from the control plane machine against the
//! cluster, and their JUnit reports read back: what ran, what passed, what
//! failed and with which message, what skipped itself and why.

mod catalog;
mod report;

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};

use super::args::E2eArgs;
use super::build::Built;
use super::cluster::Cluster;
use super::plan;
use catalog::{SUITES, skip_expression};
pub use report::{
    FirstPacketReport, ModeReport, Outcome, RuntimeStatusReport, SpecResult, SuiteReport,
    print_summary, read_junit, selected, verdict, write_results,
};

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
    // Every e2e.test process writes the kuberc spec's file into a folder
    // of /tmp it never removes (upstream's `os.Remove` of a folder not
    // empty; 38 folders a suite run): into one of the run's own instead.
    let scratch = report_dir.join("tmp");
    std::fs::create_dir_all(&scratch)?;
    cmd.env("TMPDIR", &scratch);
    let in_tmp = kubeconfig_folders_in_tmp();
    let log = report_dir.join("e2e.log");
    let mut child = host.spawn(cmd, &log)?;
    let status = child.wait();
    let _ = std::fs::remove_dir_all(&scratch);
    let status = status?;
    let left: Vec<String> = kubeconfig_folders_in_tmp()
        .difference(&in_tmp)
        .cloned()
        .collect();
    anyhow::ensure!(
        left.is_empty(),
        "e2e.test left {} kubeconfig folder(s) in /tmp, outside its TMPDIR: {left:?}",
        left.len()
    );
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

/// The folders the kubectl specs make with Go's `os.MkdirTemp`.
fn kubeconfig_folders_in_tmp() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/tmp")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("test-kuberc"))
        .collect()
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
}

//! The generated docs' text, from `Results`: docs/benchmarks.md whole (the
//! prose is benchmarks.template.md, whose `{{name}}` placeholders are
//! filled here) and the README's section (the run and the headline table).

use std::fmt::Write as _;

use anyhow::bail;
use serde_json::Value;

use super::figures;
use super::results::{Results, field};
use super::rows;
use crate::prose;

const TEMPLATE: &str = include_str!("benchmarks.template.md");

/// When, where and how the run was made: one line.
fn run_line(results: &Results) -> String {
    let text = |name: &str| results.run[name].as_str().unwrap_or("?").to_string();
    format!(
        "{}, commit {}; {}; {} interleaved round(s), {} s per data-plane measurement.",
        text("date"),
        text("commit"),
        text("machine"),
        results.config.rounds,
        results.config.seconds
    )
}

fn main_table(results: &Results) -> String {
    rows::table(&rows::rows(&results.rounds, &results.config))
}

fn services_summary(results: &Results) -> String {
    let Some(services) = &results.services else {
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

fn services_tables(results: &Results) -> String {
    results
        .services
        .as_ref()
        .map(super::socket_services::table)
        .unwrap_or_default()
}

fn overlay(results: &Results) -> String {
    let Some(overlay) = &results.overlay else {
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

fn cri(results: &Results) -> String {
    let Some(cri) = &results.cri else {
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

fn program_cost(results: &Results) -> String {
    match &results.program_cost {
        Some(cost) => super::program_cost::table(cost),
        None => "No program cost run in `results/` (program-cost.json is missing).\n".into(),
    }
}

fn e2e(results: &Results) -> String {
    if results.e2e.is_empty() {
        return "No e2e run in `results/` (no e2e-<mode>.json).\n".into();
    }
    let mut out = String::new();
    for report in &results.e2e {
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
    for report in &results.e2e {
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
    // One item per run: a paragraph of them grows past a page's limit.
    let probed: Vec<&Value> = results
        .e2e
        .iter()
        .filter(|r| r["first_packet"].is_object())
        .collect();
    if !probed.is_empty() {
        out.push_str(
            "flatnet's first-packet check (tries every 100 ms from the container's start, \
             through a deny-all-egress policy):\n\n",
        );
    }
    for report in probed {
        let probe = &report["first_packet"];
        let _ = writeln!(
            out,
            "- {}: {} of {} tries got through; through {:.1} s after the policy was deleted",
            report["mode"].as_str().unwrap_or("?"),
            probe["through"],
            probe["tries"],
            field(probe, "opened_after_seconds"),
        );
    }
    out
}

/// docs/benchmarks.md, whole.
pub fn page(results: &Results) -> anyhow::Result<String> {
    let values = [
        ("run", run_line(results)),
        ("main_table", main_table(results)),
        ("policy_table", rows::policy_table(&results.rounds)),
        (
            "before_after",
            format!(
                "Earlier build: {}.\n\n{}",
                results
                    .config
                    .before
                    .as_deref()
                    .map_or("none in this run".to_string(), |c| format!("commit {c}")),
                super::before::table(&results.rounds)
            ),
        ),
        ("variants", super::variants::table(&results.rounds)),
        ("services_summary", services_summary(results)),
        ("services_tables", services_tables(results)),
        ("overlay", overlay(results)),
        ("cri", cri(results)),
        ("program_cost", program_cost(results)),
        ("e2e", e2e(results)),
        (
            "scale",
            crate::scale::report::section(results.scale.as_ref()),
        ),
    ];
    Ok(prose::wrap(&fill(TEMPLATE, &values)?))
}

/// What goes between the README's markers: the run and the headline table.
pub fn readme_section(results: &Results) -> String {
    prose::wrap(&format!("{}\n\n{}", run_line(results), main_table(results)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfilled_placeholder_is_an_error() {
        let error = fill("a {{known}} b {{unknown}} c", &[("known", "x".into())])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("{{unknown}}"), "{error}");
    }
}

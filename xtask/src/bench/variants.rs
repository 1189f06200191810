//! Where the flatnet pair's nanoseconds go under load: `from_pod` cut
//! down (`flatnet_common::cost_variant`) and put in front of the pair's
//! own program on pod a's host veth, one variant at a time, by the tests
//! crate's `flatnet-cost-variant` (xtask cannot link the flatnet library).
//! Each variant is timed by BPF statistics in the same UDP flood and TCP
//! stream as the pairs, so the difference between the whole program and a
//! variant without one part is that part's cost on real traffic, and the
//! redirect-only variant's rate is the most any map-lookup fast path could
//! get out of this kernel's redirect.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use super::figures::{number, value_median};
use super::paths::Pair;
use super::program_stats::with_program_costs;
use super::samples::{Round, VariantSample};
use crate::util::{self, output};

const FIXTURE: &str = "flatnet-cost-variant";

/// The variants (`flatnet_common::cost_variant::NAMES`) in the order they
/// are measured and shown, with what each leaves of the program.
pub const VARIANTS: [(&str, &str); 6] = [
    ("full", "the program as deployed"),
    ("no-counters", "without the `STATS` and per-pod counters"),
    (
        "no-policy",
        "without NetworkPolicy (the pods are not selected: only their state is read)",
    ),
    (
        "no-flow",
        "without the flow's verdict (`FLOWS`, conntrack): NAT-correctness",
    ),
    (
        "redirect-only",
        "the destination's entry, its MACs, `bpf_redirect_peer`: nothing else",
    ),
    (
        "return",
        "returns at once: what BPF statistics charge any program (the deployed program then runs after it)",
    ),
];

/// Builds the fixture (debug: it only loads and attaches).
pub fn build_fixture() -> anyhow::Result<PathBuf> {
    util::build_debug()?;
    Ok(util::target_dir(false).join(FIXTURE))
}

/// A variant on pod a's host veth: its pinned link, removed on drop (which
/// takes the variant off, even when the measurement failed).
struct Attached {
    link_pin: PathBuf,
    program_id: String,
    /// Instructions the verifier kept of the variant.
    instructions: f64,
}

impl Attached {
    fn new(fixture: &Path, network: &str, host_veth: &str, variant: &str) -> anyhow::Result<Self> {
        let link_pin = PathBuf::from(format!(
            "/sys/fs/bpf/flatnet-cost-variant-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&link_pin);
        let printed = output(
            Command::new(fixture)
                .args([network, host_veth, variant])
                .arg(&link_pin),
        )
        .with_context(|| format!("putting the {variant} variant on {host_veth}"))?;
        let mut attached = Attached {
            link_pin,
            program_id: String::new(),
            instructions: f64::NAN,
        };
        let line: Value =
            serde_json::from_str(printed.trim()).context("the fixture's JSON line")?;
        let id = line["program_id"]
            .as_u64()
            .context("the fixture printed no program id")?;
        attached.program_id = id.to_string();
        attached.instructions = line["instructions"].as_f64().unwrap_or(f64::NAN);
        Ok(attached)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link_pin);
    }
}

/// Every variant in turn on `pair` (flatnet, tc mode, its network
/// `network`): the UDP flood and the TCP stream, each timed. Round `round`
/// starts at its own variant, so a place in the order costs every variant
/// alike (in a run that always began with `full`, its UDP rate was ~10%
/// under the deployed program's, the same code, in every round).
pub fn measure(
    fixture: &Path,
    pair: &Pair,
    network: &str,
    seconds: u32,
    round: usize,
) -> anyhow::Result<BTreeMap<String, VariantSample>> {
    let mut samples = BTreeMap::new();
    let mut order = VARIANTS;
    order.rotate_left(round % VARIANTS.len());
    for (variant, _) in order {
        let attached = Attached::new(fixture, network, &pair.host_veth_a, variant)?;
        let selector = || Some(vec!["id".to_string(), attached.program_id.clone()]);
        let (udp_kpps, [udp_ns]) = with_program_costs([selector()], || pair.udp_rate(seconds))?;
        let (tcp_gbps, [tcp_ns]) =
            with_program_costs([selector()], || pair.tcp_throughput(seconds))?;
        let instructions = attached.instructions;
        drop(attached);
        println!(
            "  variant {variant:<13} {instructions:5.0} insns  udp {udp_ns:5.0} ns/pkt {udp_kpps:7.1} kpps  tcp {tcp_ns:5.0} ns/pkt {tcp_gbps:6.2} Gbit/s"
        );
        samples.insert(
            variant.to_string(),
            VariantSample {
                udp_ns,
                udp_kpps,
                tcp_ns,
                tcp_gbps,
                instructions,
            },
        );
    }
    Ok(samples)
}

/// A round's variants as JSON (bench.json) and back.
pub fn parse(round: &Value) -> BTreeMap<String, VariantSample> {
    let field = |sample: &Value, name: &str| sample[name].as_f64().unwrap_or(f64::NAN);
    round["variants"]
        .as_object()
        .map(|variants| {
            variants
                .iter()
                .map(|(name, sample)| {
                    (
                        name.clone(),
                        VariantSample {
                            udp_ns: field(sample, "udp_ns"),
                            udp_kpps: field(sample, "udp_kpps"),
                            tcp_ns: field(sample, "tcp_ns"),
                            tcp_gbps: field(sample, "tcp_gbps"),
                            instructions: field(sample, "instructions"),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A count, or "-".
fn whole(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.0}")
    } else {
        "-".into()
    }
}

/// The variants' table: medians over rounds; a part's cost is the whole
/// program's time minus the variant's without it, per round; the rate is
/// against the bare veth pair's in the same round.
pub fn table(results: &[Round]) -> String {
    if results.iter().all(|round| round.variants.is_empty()) {
        return "No program variants in this run.\n".into();
    }
    let of = |pick: fn(&VariantSample) -> f64| {
        move |round: &Round, variant: &str| {
            round
                .variants
                .get(variant)
                .map(pick)
                .filter(|v| v.is_finite())
        }
    };
    let udp_ns = of(|s| s.udp_ns);
    let tcp_ns = of(|s| s.tcp_ns);
    let part = |value: &dyn Fn(&Round, &str) -> Option<f64>, variant: &str| {
        let mut costs: Vec<f64> = results
            .iter()
            .filter_map(|round| Some(value(round, "full")? - value(round, variant)?))
            .collect();
        if costs.is_empty() || variant == "full" {
            f64::NAN
        } else {
            super::control::median(&mut costs)
        }
    };
    let vs_veth = |variant: &str| {
        let mut ratios: Vec<f64> = results
            .iter()
            .filter_map(|round| {
                let kpps = round.variants.get(variant)?.udp_kpps;
                let veth = round.data.get("veth")?.udp_kpps;
                (kpps.is_finite() && veth > 0.0).then(|| kpps / veth)
            })
            .collect();
        if ratios.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}x", super::control::median(&mut ratios))
        }
    };
    let mut out = String::from(
        "| variant of `from_pod` | instructions | UDP ns/packet | full minus this | TCP ns/packet | full minus this | 64 B UDP kpps | UDP vs bare veth |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (variant, what) in VARIANTS {
        let kpps = of(|s| s.udp_kpps);
        let _ = writeln!(
            out,
            "| {variant}: {what} | {} | {} | {} | {} | {} | {} | {} |",
            whole(value_median(results, &of(|s| s.instructions), variant)),
            number(value_median(results, &udp_ns, variant)),
            number(part(&udp_ns, variant)),
            number(value_median(results, &tcp_ns, variant)),
            number(part(&tcp_ns, variant)),
            number(value_median(results, &kpps, variant)),
            vs_veth(variant),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::samples::DataSample;

    fn round(full_ns: f64, flow_ns: f64, veth_kpps: f64) -> Round {
        let mut round = Round::default();
        round.data.insert(
            "veth",
            DataSample {
                udp_kpps: veth_kpps,
                ..DataSample::default()
            },
        );
        for (name, udp_ns) in [("full", full_ns), ("no-flow", flow_ns)] {
            round.variants.insert(
                name.to_string(),
                VariantSample {
                    udp_ns,
                    udp_kpps: 100.0,
                    tcp_ns: f64::NAN,
                    tcp_gbps: f64::NAN,
                    instructions: 50.0,
                },
            );
        }
        round
    }

    #[test]
    fn a_part_costs_the_median_of_its_per_round_differences() {
        let rounds = [round(300.0, 260.0, 200.0), round(340.0, 280.0, 125.0)];
        let table = table(&rounds);
        // (40 + 60) / 2; the whole program has no part to subtract.
        assert!(
            table.contains("| no-flow: without the flow's verdict (`FLOWS`, conntrack): NAT-correctness | 50 | 270 | 50.00 | - | - | 100 | 0.65x |"),
            "{table}"
        );
        assert!(
            table.contains("| full: the program as deployed | 50 | 320 | - |"),
            "{table}"
        );
        assert!(table.contains("| return: "), "{table}");
    }

    #[test]
    fn a_run_without_variants_says_so() {
        assert_eq!(
            table(&[Round::default()]),
            "No program variants in this run.\n"
        );
    }

    #[test]
    fn a_round_reads_back_what_it_wrote() {
        let rounds = [round(300.0, 260.0, 200.0)];
        let json = serde_json::json!({"variants": rounds[0].variants});
        let back = parse(&json);
        assert_eq!(back["no-flow"].udp_ns, 260.0);
        assert!(back["full"].tcp_ns.is_nan());
    }
}

//! docs/benchmarks.md and the README's benchmark table, written from the
//! files a benchmark run left in results/ (bench.json, services.json,
//! cri.json, e2e-<mode>.json), never by hand: the numbers people read are
//! always the numbers measured. The files are read into `Results`
//! (results.rs), their text is made from benchmarks.template.md (page.rs),
//! and here both are written, the README's table between its markers.

use std::path::Path;

use anyhow::Context;

use super::page::{page, readme_section};
use super::results::Results;
use crate::markers::Section;

/// The README's generated section lies between these two lines.
const TABLE_START: &str = "<!-- bench-table -->";
const TABLE_END: &str = "<!-- /bench-table -->";

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
    let page = page(&results)?;
    let docs = root.join("docs");
    std::fs::create_dir_all(&docs)?;
    std::fs::write(docs.join("benchmarks.md"), page)?;
    let readme_path = root.join("README.md");
    let readme = std::fs::read_to_string(&readme_path)
        .with_context(|| format!("reading {}", readme_path.display()))?;
    let updated = replace_section(&readme, &readme_section(&results))?;
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
        let section = readme_section(&results);
        assert!(section.starts_with(
            "2030-01-02 03:04 UTC, commit abc1234; 2 cores; 1 interleaved round(s), 3 s per data-plane\n\
             measurement.\n\n| metric | bridge |"
        ));
        for row in [
            "| TCP throughput, 1 stream (Gbit/s) | 10.00 | 20.00 | 4.00 | 16.00 | 20.00 | 2.00 | 1.25 | 1.00 | 0.40 | bridge >= 1, veth >= 1.1, veth BIG TCP >= 0.97 | met |",
            "| CNI ADD, 50 one after another (ms/pod) | 10.00 | 4.00 | - | - | - | 0.40 | - | - | - | bridge <= 0.5 | met |",
            "| IPAM alone, flatnet-ipam with \"fsync\": false: ADD, 64 at once (ms/pod) | 10.00 | 3.00 | - | - | - | 0.30 | - | - | - | bridge <= 0.5 | met |",
        ] {
            assert!(section.contains(row), "{row}\nnot in\n{section}");
        }
        let page = page(&results)?;
        assert!(
            page.contains("| TCP throughput (Gbit/s) | 20.00 | 19.00 | 0.95 | >= 0.95 | met |")
        );
        assert!(page.contains("services.json is missing"));
        assert!(!page.contains("{{"));
        Ok(())
    }

    #[test]
    fn the_table_is_replaced_between_its_markers() -> anyhow::Result<()> {
        crate::markers::checks::replaces_between_its_markers(&README_TABLE, "new table\n")
    }

    /// The committed page and README section are exactly what the generator
    /// writes from the committed results/: a hand edit fails here.
    #[test]
    fn committed_docs_match_the_committed_results() -> anyhow::Result<()> {
        let root = crate::util::root();
        let results = Results::read(&root.join("results"))?;
        let page = std::fs::read_to_string(root.join("docs/benchmarks.md"))?;
        assert!(
            page == super::page(&results)?,
            "docs/benchmarks.md differs from what `cargo xtask docs` writes from results/: edit xtask/src/bench/benchmarks.template.md, then run `cargo xtask docs`"
        );
        let readme = std::fs::read_to_string(root.join("README.md"))?;
        assert!(
            readme == replace_section(&readme, &readme_section(&results))?,
            "the README's benchmark table differs from what `cargo xtask docs` writes from results/: run `cargo xtask docs`"
        );
        Ok(())
    }
}

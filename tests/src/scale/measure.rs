//! What the harness reads off the agent: its process's memory and CPU
//! (from /proc), quantiles of its latency histograms (from its metrics
//! page, as Prometheus's `histogram_quantile` computes them) and the
//! memory of the BPF maps pinned for it (as bpftool reports it).

use std::path::Path;
use std::time::{Duration, Instant};

/// Resident memory of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS").map(|kib| kib * 1024)
}

/// Its parts: (anonymous, file-backed, shared) bytes (`RssAnon`,
/// `RssFile`, `RssShmem`): the heap and stacks; the binary's own pages;
/// shared memory such as a memory-mapped BPF map.
pub fn rss_parts(pid: u32) -> Option<(u64, u64, u64)> {
    let bytes = |field| status_kib(pid, field).map(|kib| kib * 1024);
    Some((bytes("RssAnon")?, bytes("RssFile")?, bytes("RssShmem")?))
}

/// One `<field>: <n> kB` line of /proc/<pid>/status.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// CPU time `pid` has used (user and system), with that of the children
/// it ran and waited for (`nft`, say: the node pays for them too), from
/// /proc/<pid>/stat.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) may hold spaces: fields count from after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime, stime, cutime, cstime.
    let mut ticks = 0u64;
    for field in 11..=14 {
        ticks += fields.get(field)?.parse::<u64>().ok()?;
    }
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// Share of one core `pid` used while `during` ran.
pub fn cpu_share(pid: u32, during: impl FnOnce()) -> Option<f64> {
    let (cpu, wall) = (cpu_time(pid)?, Instant::now());
    during();
    let used = cpu_time(pid)?.saturating_sub(cpu);
    Some(used.as_secs_f64() / wall.elapsed().as_secs_f64())
}

/// One histogram of a metrics page: its cumulative buckets (upper bound,
/// count) in order, and the count of observations.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Buckets {
    pub bounds: Vec<(f64, f64)>,
    pub count: f64,
}

impl Buckets {
    /// The histogram `name` with exactly the labels `labels` (rendered as
    /// on the page, `kind="Pod"`; empty for none) besides `le`.
    pub fn read(page: &str, name: &str, labels: &str) -> Buckets {
        let prefix = format!("{name}_bucket{{");
        let mut bounds = Vec::new();
        for line in page.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let Some((inside, value)) = rest.split_once("} ") else {
                continue;
            };
            // `le` may come first (prometheus-client puts it there) or
            // last; the values here hold no commas.
            let (le, others): (Vec<&str>, Vec<&str>) = inside
                .split(',')
                .partition(|label| label.starts_with("le="));
            let Some(le) = le.first().and_then(|le| le.strip_prefix("le=")) else {
                continue;
            };
            if others.join(",") != labels {
                continue;
            }
            let bound = match le.trim_matches('"') {
                "+Inf" => f64::INFINITY,
                other => other.parse().unwrap_or(f64::NAN),
            };
            bounds.push((bound, value.trim().parse().unwrap_or(0.0)));
        }
        let count = bounds.last().map(|(_, c)| *c).unwrap_or(0.0);
        Buckets { bounds, count }
    }

    /// Observations since `before` (the same histogram read earlier).
    pub fn since(&self, before: &Buckets) -> Buckets {
        let bounds = self
            .bounds
            .iter()
            .map(|(bound, count)| {
                let earlier = before
                    .bounds
                    .iter()
                    .find(|(b, _)| b == bound)
                    .map(|(_, c)| *c)
                    .unwrap_or(0.0);
                (*bound, count - earlier)
            })
            .collect();
        Buckets {
            bounds,
            count: self.count - before.count,
        }
    }

    /// The `q` quantile, linear within its bucket as Prometheus's
    /// `histogram_quantile`; None without observations. One in the
    /// last (+Inf) bucket is reported as the largest finite bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let rank = q * self.count;
        let mut lower = (0.0, 0.0);
        for (bound, cumulative) in &self.bounds {
            if *cumulative >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let inside = cumulative - lower.1;
                let fraction = if inside > 0.0 {
                    (rank - lower.1) / inside
                } else {
                    1.0
                };
                return Some(lower.0 + (bound - lower.0) * fraction);
            }
            lower = (*bound, *cumulative);
        }
        Some(lower.0)
    }
}

/// Bytes the BPF maps pinned under `pins` take (bpftool's
/// `bytes_memlock`), each map once.
pub fn map_memory(pins: &Path) -> u64 {
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0;
    for file in pinned_files(pins) {
        let Ok(output) = std::process::Command::new("bpftool")
            .args(["-j", "map", "show", "pinned"])
            .arg(&file)
            .output()
        else {
            continue;
        };
        // A program's pin is not a map: bpftool says so and prints no JSON.
        let Ok(map) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
            continue;
        };
        if let (Some(id), Some(bytes)) = (map["id"].as_u64(), map["bytes_memlock"].as_u64())
            && seen.insert(id)
        {
            total += bytes;
        }
    }
    total
}

fn pinned_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => files.extend(pinned_files(&path)),
            Ok(_) => files.push(path),
            Err(_) => {}
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# TYPE h histogram
h_bucket{le=\"0.001\",kind=\"Pod\"} 50
h_bucket{le=\"0.002\",kind=\"Pod\"} 90
h_bucket{le=\"+Inf\",kind=\"Pod\"} 100
h_bucket{kind=\"NetworkPolicy\",le=\"0.001\"} 0
h_bucket{kind=\"NetworkPolicy\",le=\"+Inf\"} 0
g_bucket{le=\"1.0\"} 3
g_bucket{le=\"+Inf\"} 4
";

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        let pods = Buckets::read(PAGE, "h", "kind=\"Pod\"");
        assert_eq!(pods.count, 100.0);
        assert_eq!(pods.quantile(0.5), Some(0.001));
        let p70 = pods.quantile(0.7).unwrap();
        assert!((p70 - 0.0015).abs() < 1e-12, "{p70}");
        // Beyond the last finite bound: that bound.
        assert_eq!(pods.quantile(0.99), Some(0.002));
        assert_eq!(
            Buckets::read(PAGE, "h", "kind=\"NetworkPolicy\"").quantile(0.5),
            None
        );
        let plain = Buckets::read(PAGE, "g", "");
        assert_eq!(plain.count, 4.0);
        assert_eq!(plain.quantile(0.5), Some(2.0 / 3.0));
    }

    #[test]
    fn a_later_reading_less_an_earlier_one_is_what_came_between() {
        let before = Buckets::read(PAGE, "g", "");
        let later = PAGE
            .replace("g_bucket{le=\"1.0\"} 3", "g_bucket{le=\"1.0\"} 5")
            .replace("g_bucket{le=\"+Inf\"} 4", "g_bucket{le=\"+Inf\"} 6");
        let between = Buckets::read(&later, "g", "").since(&before);
        assert_eq!(between.count, 2.0);
        assert_eq!(between.bounds, vec![(1.0, 2.0), (f64::INFINITY, 2.0)]);
    }

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 1 << 20);
        let (anon, file, _) = rss_parts(pid).unwrap();
        assert!(anon > 0 && file > 0 && anon + file <= rss_bytes(pid).unwrap() + (1 << 20));
        let share = cpu_share(pid, || {
            let start = Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(300) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .unwrap();
        // Some of the 300 ms on a core, however busy the machine is.
        assert!(share > 0.0, "{share}");
    }

    #[test]
    fn a_waited_for_childs_cpu_time_is_counted() {
        let pid = std::process::id();
        let before = cpu_time(pid).unwrap();
        // The child burns CPU; this process only waits for it.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let used = cpu_time(pid).unwrap().saturating_sub(before);
        assert!(used >= Duration::from_millis(50), "{used:?}");
    }
}

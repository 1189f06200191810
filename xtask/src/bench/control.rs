//! Control plane: CNI ADD and DEL time per pod, one after another and all
//! at once, measured from the runtime's side (spawn to exit).

use std::process::Command;
use std::time::{Duration, Instant};

use flatnet_harness::{Netns, poll_until};

use crate::cni::Plugin;

/// Concurrent ADDs of the IPAM-alone comparison: the 64-way, fewer
/// in a smoke run.
pub fn ipam_concurrent(concurrent: usize) -> usize {
    (concurrent * 2).min(64)
}

/// Milliseconds per pod for one plugin in one round.
#[derive(Debug, Clone, Copy, Default)]
pub struct CniTimes {
    /// The IPAM plugin alone (host-local for bridge, flatnet-ipam for flatnet).
    pub ipam_add_sequential: f64,
    pub ipam_add_concurrent: f64,
    /// Median of the sequential ADDs.
    pub add_sequential: f64,
    pub del_sequential: f64,
    /// Wall time of the concurrent batch divided by its size.
    pub add_concurrent: f64,
    pub del_concurrent: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Links in the host namespace: used to wait until deferred unregisters
/// (flatnet's work after the answer) are done, so one phase does not pay for the last.
fn link_count() -> usize {
    Command::new("ip")
        .args(["-o", "link"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).lines().count())
        .unwrap_or(0)
}

fn settle(baseline: usize) {
    // Measured either way: slow work after the answer shows in the next phase's numbers.
    let _ = poll_until(Duration::from_secs(30), Duration::from_millis(20), || {
        link_count() <= baseline
    });
}

/// Measures one plugin. An "anchor" pod stays attached throughout, as on a
/// node that already runs pods, so neither plugin pays its first-pod set-up
/// (bridge creation, datapath load) inside the numbers.
pub fn measure(
    label: &str,
    plugin: &Plugin,
    sequential: usize,
    concurrent: usize,
) -> anyhow::Result<CniTimes> {
    let anchor = Netns::named(&format!("fb-cp-{label}-anchor"))?;
    let anchor_id = format!("fb-cp-{label}-anchor");
    plugin.call("ADD", &anchor_id, &anchor.path())?;
    let baseline = link_count();
    let outcome = (|| -> anyhow::Result<CniTimes> {
        let mut times = CniTimes::default();

        let pods: Vec<_> = (0..sequential)
            .map(|i| {
                Netns::named(&format!("fb-cp-{label}-s{i}"))
                    .map(|ns| (ns, format!("fb-cp-{label}-s{i}")))
            })
            .collect::<Result<_, _>>()?;
        let mut adds = Vec::with_capacity(sequential);
        for (netns, id) in &pods {
            let started = Instant::now();
            plugin.call("ADD", id, &netns.path())?;
            adds.push(ms(started.elapsed()));
        }
        let mut dels = Vec::with_capacity(sequential);
        for (netns, id) in &pods {
            let started = Instant::now();
            plugin.call("DEL", id, &netns.path())?;
            dels.push(ms(started.elapsed()));
        }
        drop(pods);
        settle(baseline);
        times.add_sequential = median(&mut adds);
        times.del_sequential = median(&mut dels);

        let pods: Vec<_> = (0..concurrent)
            .map(|i| {
                Netns::named(&format!("fb-cp-{label}-c{i}"))
                    .map(|ns| (ns, format!("fb-cp-{label}-c{i}")))
            })
            .collect::<Result<_, _>>()?;
        for (verb, slot) in [
            ("ADD", &mut times.add_concurrent),
            ("DEL", &mut times.del_concurrent),
        ] {
            let started = Instant::now();
            let children = pods
                .iter()
                .map(|(netns, id)| plugin.start(verb, id, &netns.path()))
                .collect::<Result<Vec<_>, _>>()?;
            for child in children {
                plugin.finish(verb, child)?;
            }
            *slot = ms(started.elapsed()) / concurrent as f64;
        }
        drop(pods);
        settle(baseline);
        Ok(times)
    })();
    if let Err(e) = plugin.call("DEL", &anchor_id, &anchor.path()) {
        eprintln!("bench cleanup: {e}");
    }
    outcome
}

/// An IPAM plugin alone: ms per ADD, sequential (median) and all at once
/// (wall time / count). Each phase starts from an empty data dir; the
/// allocations are released again afterwards (not timed).
pub fn measure_ipam(
    plugin: &Plugin,
    sequential: usize,
    concurrent: usize,
    data_dir: &std::path::Path,
) -> anyhow::Result<(f64, f64)> {
    let netns = std::path::Path::new("/proc/self/ns/net");
    let _ = std::fs::remove_dir_all(data_dir);
    let ids: Vec<String> = (0..sequential).map(|i| format!("ipam-s{i}")).collect();
    let mut adds = Vec::with_capacity(sequential);
    for id in &ids {
        let started = Instant::now();
        plugin.call("ADD", id, netns)?;
        adds.push(ms(started.elapsed()));
    }
    for id in &ids {
        plugin.call("DEL", id, netns)?;
    }
    let _ = std::fs::remove_dir_all(data_dir);
    let ids: Vec<String> = (0..concurrent).map(|i| format!("ipam-c{i}")).collect();
    let started = Instant::now();
    let children = ids
        .iter()
        .map(|id| plugin.start("ADD", id, netns))
        .collect::<Result<Vec<_>, _>>()?;
    for child in children {
        plugin.finish("ADD", child)?;
    }
    let at_once = ms(started.elapsed()) / concurrent as f64;
    for id in &ids {
        plugin.call("DEL", id, netns)?;
    }
    let _ = std::fs::remove_dir_all(data_dir);
    Ok((median(&mut adds), at_once))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}

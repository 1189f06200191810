//! The runtime's side of CNI, through containerd 2 itself:
//!
//! - which verbs containerd calls on flatnet, how often and when: read
//!   from the line flatnet's runner writes per invocation to the
//!   conflist's `logFile` (machine.rs), over the whole critest run;
//! - a sandbox whose ADD is killed: `crictl runp` while flatnet's ADD is
//!   SIGKILLed at a different moment each round (as the OOM killer or a
//!   node under pressure would), then, before anything of ours removes a
//!   thing, the network must be as empty as before: containerd's own
//!   clean-up (CNI DEL of the failed sandbox) has to take back the address
//!   flatnet-ipam gave, the veth and the pod's map entries.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use super::machine::Machine;
use super::names::{CNI_LOG, SOCKET};

/// The CNI verbs and what containerd made of them.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct VerbTally {
    pub ok: usize,
    pub failed: usize,
    /// Seconds from the first invocation of any verb.
    pub first_at: f64,
    pub last_at: f64,
}

/// Per verb (ADD, DEL, CHECK, STATUS, GC), from the log's lines
/// `<unix time> pid=.. container=.. ifname=.. <VERB> ok in ..` or
/// `<VERB> failed: ..`: flatnet's, which containerd called (flatnet-ipam,
/// which flatnet called, writes `flatnet-ipam <VERB> ..`, left out).
pub fn tally(log: &str) -> BTreeMap<String, VerbTally> {
    let mut verbs: BTreeMap<String, VerbTally> = BTreeMap::new();
    let mut start = None;
    for line in log.lines() {
        let mut words = line.split_whitespace();
        let Some(at) = words.next().and_then(|t| t.parse::<f64>().ok()) else {
            continue;
        };
        let Some(verb) = words.find(|w| !w.contains('=')) else {
            continue;
        };
        let ok = match words.next() {
            Some("ok") => true,
            Some("failed:") => false,
            _ => continue,
        };
        let start = *start.get_or_insert(at);
        let entry = verbs.entry(verb.to_string()).or_insert(VerbTally {
            first_at: at - start,
            ..VerbTally::default()
        });
        if ok {
            entry.ok += 1;
        } else {
            entry.failed += 1;
        }
        entry.last_at = at - start;
    }
    verbs
}

/// What the killed ADDs came to.
#[derive(Debug, Serialize)]
pub struct MidAddReport {
    pub rounds: usize,
    /// ADD processes SIGKILLed (a round whose ADD ended first kills none).
    pub killed: usize,
    /// `crictl runp` calls that failed (each killed one must).
    pub runp_failed: usize,
    /// DELs containerd ran meanwhile (its clean-up of the failed ones).
    pub dels: usize,
    /// What was left of the network before anything of ours removed a
    /// sandbox: empty, or the failure.
    pub left: Vec<String>,
}

const ROUNDS: usize = 12;
/// How much later each round kills: an ADD here takes 0.5-0.8 s (with no
/// agent on this machine each first ADD loads the datapath), so the kills
/// fall before IPAM, after it, while the datapath loads, while the veth
/// is made, and some after the answer.
const STEP: Duration = Duration::from_millis(50);

/// ROUNDS sandboxes, each ADD killed a little later than the last.
pub fn kill_mid_add(machine: &Machine, crictl: &Path) -> anyhow::Result<MidAddReport> {
    let log = machine
        .host
        .dir
        .join("root")
        .join(CNI_LOG.trim_start_matches('/'));
    let dels_before = count_dels(&log);
    // The plugins containerd runs are in the machine's network namespace.
    let netns = std::fs::read_link(format!("/proc/{}/ns/net", machine.host.pid()))?;
    let mut report = MidAddReport {
        rounds: ROUNDS,
        killed: 0,
        runp_failed: 0,
        dels: 0,
        left: Vec::new(),
    };
    let configs = machine.host.dir.join("tmp");
    for round in 0..ROUNDS {
        let name = format!("mid-add-{round}");
        let config = configs.join(format!("{name}.json"));
        std::fs::write(
            &config,
            serde_json::json!({
                "metadata": {"name": name, "namespace": "flatnet-mid-add", "uid": name, "attempt": 0},
                "log_directory": "/tmp",
                "linux": {}
            })
            .to_string(),
        )?;
        let mut runp = machine.command(crictl);
        runp.args(["--runtime-endpoint", &format!("unix://{SOCKET}")])
            .args(["--timeout", "60s", "runp"])
            .arg(format!("/tmp/{name}.json"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let child = runp.spawn().context("starting crictl runp")?;
        let delay = STEP * round as u32;
        if kill_flatnet_add(&netns, delay, Duration::from_secs(30))? {
            report.killed += 1;
        }
        let out = child.wait_with_output()?;
        if out.status.success() {
            // Its ADD ended before the kill: a sandbox of ours to remove.
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            remove_sandbox(machine, crictl, &id)?;
        } else {
            report.runp_failed += 1;
        }
    }
    // Every ADD ran and every DEL containerd wanted has run; nothing of
    // ours removed a thing yet.
    std::thread::sleep(Duration::from_secs(2));
    report.dels = count_dels(&log).saturating_sub(dels_before);
    report.left = machine.network_leftovers();
    Ok(report)
}

/// Waits up to `timeout` for flatnet's ADD process in `netns`, lets it
/// run `delay`, and SIGKILLs it; false when it had ended by then.
fn kill_flatnet_add(netns: &Path, delay: Duration, timeout: Duration) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    let pid = loop {
        if let Some(pid) = find_flatnet_add(netns) {
            break pid;
        }
        if Instant::now() > deadline {
            bail!("no flatnet ADD started within {timeout:?} of crictl runp");
        }
        std::thread::sleep(Duration::from_micros(500));
    };
    std::thread::sleep(delay);
    // A zombie (or a gone process) had finished its ADD.
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z")
        })
        .unwrap_or(false);
    let pid = nix::unistd::Pid::from_raw(pid);
    Ok(alive && nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok())
}

/// A running `flatnet` plugin process in `netns` whose CNI_COMMAND is ADD.
fn find_flatnet_add(netns: &Path) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            if exe.file_name()? != "flatnet"
                || std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()? != netns
            {
                return None;
            }
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            environ
                .split(|b| *b == 0)
                .any(|var| var == b"CNI_COMMAND=ADD")
                .then_some(pid)
        })
}

fn count_dels(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|text| tally(&text).get("DEL").map_or(0, |t| t.ok))
        .unwrap_or(0)
}

fn remove_sandbox(machine: &Machine, crictl: &Path, id: &str) -> anyhow::Result<()> {
    let endpoint = format!("unix://{SOCKET}");
    for verb in ["stopp", "rmp"] {
        machine
            .host
            .run(
                &crictl.display().to_string(),
                &["--runtime-endpoint", &endpoint, verb, id],
            )
            .with_context(|| format!("crictl {verb} {id}"))?;
    }
    Ok(())
}

/// The results/critest.md section.
pub fn markdown(verbs: &BTreeMap<String, VerbTally>, mid_add: &MidAddReport) -> String {
    let step = STEP.as_millis();
    let mut text = String::from(
        "\n## CNI verbs containerd called on flatnet (the whole run)\n\n\
         | verb | ok | failed | first at | last at |\n|---|---|---|---|---|\n",
    );
    for wanted in ["ADD", "DEL", "CHECK", "STATUS", "GC"] {
        match verbs.get(wanted) {
            Some(t) => text.push_str(&format!(
                "| {wanted} | {} | {} | {:.0} s | {:.0} s |\n",
                t.ok, t.failed, t.first_at, t.last_at
            )),
            None => text.push_str(&format!("| {wanted} | never called | | | |\n")),
        }
    }
    text.push_str(&format!(
        "\n## A sandbox whose ADD is killed\n\n{} rounds of `crictl runp`, flatnet's ADD SIGKILLed 0, {step}, {}, ... ms after it started: \
         {} killed (the others had ended), {} runp failed, {} DELs run by containerd's own clean-up; left of the network before anything else removed a sandbox: {}.\n",
        mid_add.rounds,
        2 * step,
        mid_add.killed,
        mid_add.runp_failed,
        mid_add.dels,
        if mid_add.left.is_empty() {
            "nothing".to_string()
        } else {
            mid_add.left.join("; ")
        }
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_tallied_from_the_runners_lines() {
        let log = "100.000 pid=1 container=a ifname=eth0 ADD ok in 12.0 ms\n\
                   101.500 pid=2 container= ifname= STATUS ok in 0.3 ms\n\
                   102.000 pid=3 container=a ifname=eth0 DEL failed: no such thing (CNI error code 7)\n\
                   103.000 pid=4 container=a ifname=eth0 DEL ok in 3.0 ms\n\
                   103.100 pid=6 container=a ifname=eth0 flatnet-ipam DEL ok in 0.5 ms\n\
                   garbage\n\
                   104.000 pid=5 container= ifname= STATUS ok in 0.2 ms\n";
        let verbs = tally(log);
        assert_eq!(verbs["ADD"].ok, 1);
        assert_eq!((verbs["DEL"].ok, verbs["DEL"].failed), (1, 1));
        assert_eq!(verbs["STATUS"].ok, 2);
        assert_eq!(verbs["STATUS"].first_at, 1.5);
        assert_eq!(verbs["STATUS"].last_at, 4.0);
        assert!(!verbs.contains_key("GC"));
    }
}

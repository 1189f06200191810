//! A running suite's record on the node: the forwarding switches and the
//! node's objects ([`NodeObjects`]) as the suite found them. A suite
//! killed outright (SIGKILL, a machine's session ending) cannot clean up
//! after itself: the next one finds the record, removes what is new since
//! that run began, and puts the switches back. The lock beside it, held
//! for the whole run, tells a killed run's record from a running one's.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, bail};
use flatnet_harness::NodeObjects;
use nix::fcntl::{Flock, FlockArg};

use crate::util::{self, heading};

/// In /run, beside none of the places [`NodeObjects`] lists.
const RECORD: &str = "/run/flatnet-suite.record";
const LOCK: &str = "/run/flatnet-suite.lock";

/// The node taken for one suite run; the record goes when it ends.
pub struct SuiteRecord {
    _lock: Flock<File>,
}

impl SuiteRecord {
    /// Refused while another suite runs on the node (its leak check
    /// would count this one's objects); what a killed run left is removed
    /// first. `bin_dir` holds the build's binaries (its processes).
    pub fn begin(bin_dir: &Path) -> anyhow::Result<Self> {
        let lock = Flock::lock(File::create(LOCK)?, FlockArg::LockExclusiveNonblock).map_err(
            |_| {
                anyhow::anyhow!(
                    "another `cargo xtask test` is running on this node: the suite needs the node to itself (it counts what is new on it); wait for it to end"
                )
            },
        )?;
        if let Ok(record) = std::fs::read_to_string(RECORD) {
            undo_killed_run(&record, bin_dir)?;
        }
        let forwarding: Vec<(String, String)> = util::forwarding_now()
            .into_iter()
            .map(|(path, value)| (path.to_string(), value))
            .collect();
        let record = render(&forwarding, &NodeObjects::now(bin_dir));
        std::fs::write(RECORD, record).with_context(|| format!("writing {RECORD}"))?;
        Ok(SuiteRecord { _lock: lock })
    }
}

impl Drop for SuiteRecord {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(RECORD);
    }
}

/// `forwarding <path> <value>` and `object <listing>` lines.
fn render(forwarding: &[(String, String)], objects: &NodeObjects) -> String {
    let mut record: String = forwarding
        .iter()
        .map(|(path, value)| format!("forwarding {path} {}\n", value.trim()))
        .collect();
    for line in objects.to_lines().lines() {
        record.push_str(&format!("object {line}\n"));
    }
    record
}

fn parse(record: &str) -> (Vec<(String, String)>, NodeObjects) {
    let forwarding = record
        .lines()
        .filter_map(|line| line.strip_prefix("forwarding ")?.split_once(' '))
        .map(|(path, value)| (path.to_string(), value.to_string()))
        .collect();
    let objects: Vec<&str> = record
        .lines()
        .filter_map(|line| line.strip_prefix("object "))
        .collect();
    (forwarding, NodeObjects::from_lines(&objects.join("\n")))
}

/// What the run that wrote `record` made and left, removed: a cluster of
/// `cargo xtask e2e`'s by its own clean-up, the rest object by object.
fn undo_killed_run(record: &str, bin_dir: &Path) -> anyhow::Result<()> {
    heading("an earlier suite run was killed: removing what it left on the node");
    crate::e2e::undo_killed_run();
    let (forwarding, before) = parse(record);
    remove_and_put_back(&NodeObjects::now(bin_dir).new_since(&before), &forwarding)?;
    std::fs::remove_file(RECORD).with_context(|| format!("removing {RECORD}"))
}

/// `left` removed, the `forwarding` switches set back.
fn remove_and_put_back(left: &[String], forwarding: &[(String, String)]) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for object in flatnet_harness::in_removal_order(left) {
        println!("  removing {object}");
        if let Err(e) = flatnet_harness::remove_object(&object) {
            failed.push(e);
        }
    }
    for (path, value) in forwarding {
        // Said only when it changes: a killed run may have left it as found.
        let now = std::fs::read_to_string(path).unwrap_or_default();
        if now.trim() == value.trim() {
            continue;
        }
        println!("  {path} back to {value}");
        if let Err(e) = std::fs::write(path, value) {
            failed.push(format!("setting {path} back to {value}: {e}"));
        }
    }
    if !failed.is_empty() {
        bail!(
            "a killed suite run left objects that could not be removed (remove them by hand, then run again):\n  {}",
            failed.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back() {
        let objects = NodeObjects::from_lines("/run/netns/a\nprocess /t/debug/flatnet-agent --x\n");
        let forwarding = vec![(
            "/proc/sys/net/ipv4/ip_forward".to_string(),
            "0\n".to_string(),
        )];
        let (read, listed) = parse(&render(&forwarding, &objects));
        assert_eq!(
            read,
            [("/proc/sys/net/ipv4/ip_forward".to_string(), "0".to_string())]
        );
        assert_eq!(listed, objects);
    }

    /// A killed run's namespace, scratch folder, process and forwarding
    /// switch: gone and put back by the next run's undo; what was there
    /// before the killed run began stays.
    #[test]
    fn the_next_run_removes_what_a_killed_one_left() {
        let test = "the_next_run_removes_what_a_killed_one_left";
        if !flatnet_harness::require(test, flatnet_harness::is_root(), "namespaces need root") {
            return;
        }
        let bin_dir = std::env::temp_dir().join(flatnet_harness::unique("flatnet-bins-"));
        std::fs::create_dir(&bin_dir).unwrap();
        let kept = flatnet_harness::Netns::unique("ft-kept-").unwrap();
        // IPv4's switch only: IPv6's turns router advertisements off.
        let switch = util::FORWARDING_SWITCHES[0];
        let forwarding = std::fs::read_to_string(switch).unwrap();
        let record = render(
            &[(switch.to_string(), forwarding.clone())],
            &NodeObjects::now(&bin_dir),
        );
        // The killed run's (this test removes them too, after its checks).
        let left_netns = flatnet_harness::Netns::new();
        let scratch = std::env::temp_dir().join(flatnet_harness::unique("flatnet-left-"));
        std::fs::create_dir_all(scratch.join("inner")).unwrap();
        let sleeper = bin_dir.join("flatnet-sleeper");
        std::fs::copy("/bin/sleep", &sleeper).unwrap();
        // Not this test's child (the sweep spares its own children): a
        // shell's, left when the shell exits, as a killed run's are.
        let started = std::process::Command::new("sh")
            .args(["-c", "\"$0\" 300 >/dev/null 2>&1 & echo $!"])
            .arg(&sleeper)
            .output()
            .unwrap();
        let pid: i32 = String::from_utf8_lossy(&started.stdout)
            .trim()
            .parse()
            .unwrap();
        let running = move || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains("(flatnet-sleeper) ") && !stat.contains(") Z "))
        };
        flatnet_harness::wait_until(
            "the process to run",
            std::time::Duration::from_secs(5),
            running,
        );
        let other = if forwarding.trim() == "1" { "0" } else { "1" };
        std::fs::write(switch, other).unwrap();

        // Only this test's own objects: other tests run beside it.
        let (saved, before) = parse(&record);
        let mark = format!("{:x}", std::process::id() & 0xfffff);
        let left: Vec<String> = NodeObjects::now(&bin_dir)
            .new_since(&before)
            .into_iter()
            .filter(|object| object.contains(&mark))
            .collect();
        let undone = remove_and_put_back(&left, &saved);
        let exited = flatnet_harness::poll_until(
            std::time::Duration::from_secs(2),
            flatnet_harness::POLL_INTERVAL,
            || !running(),
        );
        let after = std::fs::read_to_string(switch).unwrap();
        let (netns_gone, scratch_gone) = (!left_netns.path().exists(), !scratch.exists());
        // Whatever the checks find, the node as it was.
        let _ = (
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            ),
            std::fs::remove_dir_all(&bin_dir),
            std::fs::remove_dir_all(&scratch),
            std::fs::write(switch, forwarding.trim()),
        );
        drop(left_netns);
        undone.unwrap();
        assert!(netns_gone, "the killed run's namespace");
        assert!(scratch_gone, "the killed run's scratch folder");
        assert!(exited, "the killed run's process");
        assert_eq!(after.trim(), forwarding.trim(), "forwarding");
        assert!(kept.path().exists(), "what was there before the killed run");
    }
}

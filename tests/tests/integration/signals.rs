//! A run ended by a signal (a CI timeout, `timeout`, ^C) skips every
//! `Drop`: what it made must still go (`flatnet_tests::remove_on_signal`).
//! The file runs alone (`gate`), so whatever is new on the node after its
//! test is that test's.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flatnet_tests::*;

/// The node's objects (`NodeObjects`): namespaces, host links, the
/// plugin's run state, pins, cgroups, scratch folders, mounts, and
/// processes that run flatnet's binaries.
fn node_objects() -> NodeObjects {
    NodeObjects::now(&bin_dir())
}

/// A child process, sent SIGTERM and waited for on drop (a failed test's
/// bench still removes what it made).
struct Ended(Child);

impl Drop for Ended {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            terminate(&self.0);
            let _ = self.0.wait();
        }
    }
}

fn terminate(child: &Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
}

/// The Services bench, ended by SIGTERM while its host-namespace network
/// (pods, an IPAM folder, pins, a gateway device) is up, then (a second
/// run) while a simulated cluster (a bpffs mount, node namespaces, agents
/// and their run state) is. One after the other: each judges what is new
/// on the node since it began.
#[flatnet_test(root)]
fn a_bench_ended_by_a_signal_leaves_nothing_behind() {
    bench_ended_when("network's pods", |new| {
        any_contains(new, "/tmp/flatnet-test-ipam-") && any_contains(new, "/run/netns/")
    });
    bench_ended_when("simulated cluster's agents", |new| {
        any_contains(new, "/flatnet-cluster-") && any_contains(new, "flatnet-agent")
    });
}

fn any_contains(objects: &[String], part: &str) -> bool {
    objects.iter().any(|object| object.contains(part))
}

/// Starts the Services bench, sends it SIGTERM once the objects new on
/// the node since it started show `what` (`up`: judged on what is new, so
/// that another file's test whose objects are still going cannot make the
/// signal come before the bench's handler is there), and checks that it exits as a process the signal
/// ended (143, not an abort), leaves none of them, and puts the host's
/// forwarding switches back.
fn bench_ended_when(what: &str, up: impl Fn(&[String]) -> bool) {
    let before = node_objects();
    let forwarding_before = forwarding::host();
    let mut bench = Ended(
        Command::new(bin("flatnet-services-bench"))
            .args(["2", "10"])
            .env("FLATNET_BIN_DIR", bin_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the Services bench"),
    );
    wait_until(
        &format!("the bench's {what}"),
        Duration::from_secs(120),
        || up(&node_objects().new_since(&before)),
    );
    let bench = &mut bench.0;
    terminate(bench);
    let status = bench.wait().expect("waiting for the bench");
    let mut stderr = String::new();
    std::io::Read::read_to_string(bench.stderr.as_mut().expect("stderr"), &mut stderr)
        .expect("the bench's stderr");
    // 143: exit(128 + SIGTERM) after the clean-up; an abort has no code.
    assert_eq!(status.code(), Some(143), "{status:?}: {stderr}");
    assert!(
        stderr.contains("removing what this process made"),
        "{stderr}"
    );
    let left = left_since(&before, &bin_dir(), SETTLE_AFTER_RUN);
    assert!(
        left.is_empty(),
        "left behind by the bench ended among {what}: {left:#?}"
    );
    assert_eq!(forwarding::host(), forwarding_before);
}

//! Host links (whether one exists or is gone, its packet counters) and the
//! datagrams a namespace's IPv4 stack forwarded.

use std::path::Path;
use std::time::Duration;

use crate::{POLL_INTERVAL, poll_until};

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// rx and tx packet counters of a host interface.
pub fn link_packets(name: &str) -> (u64, u64) {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{name}/statistics/{what}"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    };
    (read("rx_packets"), read("tx_packets"))
}

/// The IPv4 ForwDatagrams counter of the calling thread's network
/// namespace (the host's, or a node's inside `Netns::run`).
pub fn forwarded_datagrams() -> u64 {
    // thread-self: /proc/net would show the process's namespace.
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
    let mut lines = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "ForwDatagrams")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0)
}

/// DEL cuts a link off at once and leaves its unregister (tens of ms of RCU
/// waiting in the kernel) to a detached reaper: waits for it to vanish.
pub fn wait_link_gone(link: &str, timeout: Duration) -> bool {
    poll_until(timeout, POLL_INTERVAL, || !link_exists(link))
}

//! Waiting for a condition: the one poll loop of the tests and xtask.

use std::time::{Duration, Instant};

/// How often [`wait_until`] looks again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Checks `condition` every `interval` until it holds (true) or `timeout`
/// has passed (false). It is checked once more at the deadline, so a
/// condition that holds by then is never reported as timed out. For the
/// places that must not panic (cleanup, a bench settling).
pub fn poll_until(
    timeout: Duration,
    interval: Duration,
    mut condition: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(interval.min(left));
    }
}

/// Waits until `condition` holds; panics naming `what` when `timeout`
/// passes first.
#[track_caller]
pub fn wait_until(what: &str, timeout: Duration, condition: impl FnMut() -> bool) {
    if !poll_until(timeout, POLL_INTERVAL, condition) {
        panic!("timed out after {timeout:?} waiting for {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_that_comes_true_ends_the_wait() {
        let mut calls = 0;
        wait_until("the third call", Duration::from_secs(5), || {
            calls += 1;
            calls == 3
        });
        assert_eq!(calls, 3);
    }

    #[test]
    fn a_condition_that_never_holds_times_out() {
        let started = Instant::now();
        let mut calls = 0;
        let held = poll_until(Duration::from_millis(50), Duration::from_millis(10), || {
            calls += 1;
            false
        });
        assert!(!held);
        assert!(started.elapsed() >= Duration::from_millis(50));
        // Checked at the start, every 10 ms, and once more at the deadline.
        assert!(calls >= 3, "{calls}");
    }

    #[test]
    #[should_panic(expected = "timed out after 10ms waiting for Godot")]
    fn wait_until_names_what_it_waited_for() {
        wait_until("Godot", Duration::from_millis(10), || false);
    }
}

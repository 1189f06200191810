//! How long a cluster change takes to reach this node's datapath.
//!
//! - `flatnet_network_programming_duration_seconds` (`--services ebpf`):
//!   kube-proxy's `kubeproxy_network_programming_duration_seconds`, with its
//!   meaning (SIG Scalability's network programming latency SLI): from an
//!   EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time` (when
//!   the change behind it happened, a pod turning ready say, as the
//!   EndpointSlice controller stamps it) until the Service maps hold it.
//!   Changes stamped before the agent started are not counted, as
//!   kube-proxy does not count them.
//! - `flatnet_change_to_datapath_seconds{kind}`: from the agent receiving a
//!   watch event of `kind` until the pass that followed wrote what it
//!   changes (policy tables, Service maps): the agent's own part. For
//!   `NetworkPolicy` it is the policy implementation delay (Cilium's
//!   `policy_implementation_delay`).
//!
//! The watches stamp each change as it comes ([`ChangeStamps::record`]); a
//! pass takes the stamps before it reads the objects and observes them once
//! it has written the datapath, so a change that came during the pass
//! waits for the next one and is measured to it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The annotation the EndpointSlice controller stamps each slice with.
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Stamps kept between two passes, at most: a pass runs every few
/// milliseconds while changes come, so only a stalled agent gets near it;
/// beyond it changes are still applied, only not measured.
const MAX_STAMPS: usize = 100_000;

/// A watched kind (`NetworkPolicy`, `Pod`, ...).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Buckets from 100 µs to about 26 s, each √2 times the one before: fine
/// enough to read a p50 of a few milliseconds and a p99 of seconds.
fn buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, std::f64::consts::SQRT_2, 37)
}

/// The two histograms.
#[derive(Debug, Clone)]
pub struct ChangeLatency {
    pub network_programming: Histogram,
    pub change_to_datapath: Family<KindLabel, Histogram>,
}

impl Default for ChangeLatency {
    fn default() -> Self {
        ChangeLatency {
            network_programming: Histogram::new(buckets()),
            change_to_datapath: Family::new_with_constructor(|| Histogram::new(buckets())),
        }
    }
}

impl ChangeLatency {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "flatnet_network_programming_duration_seconds",
            "From an EndpointSlice change's last-change-trigger-time until this node's Service maps hold it (kube-proxy's network programming latency; --services ebpf)",
            self.network_programming.clone(),
        );
        registry.register(
            "flatnet_change_to_datapath_seconds",
            "From the agent receiving a watch event until the datapath holds what it changes, per kind (NetworkPolicy: the policy implementation delay)",
            self.change_to_datapath.clone(),
        );
    }

    /// Observes `taken` as of now; trigger times only when `services` (the
    /// Service maps are this node's Service datapath).
    pub fn observe(&self, taken: Taken, services: bool) {
        let now = Instant::now();
        for (kind, at) in taken.changes {
            self.change_to_datapath
                .get_or_create(&KindLabel { kind: kind.into() })
                .observe(now.saturating_duration_since(at).as_secs_f64());
        }
        if services {
            let now = SystemTime::now();
            for trigger in taken.triggers {
                let latency = now.duration_since(trigger).unwrap_or(Duration::ZERO);
                self.network_programming.observe(latency.as_secs_f64());
            }
        }
    }
}

/// The changes received since the last pass took them.
#[derive(Debug, Default, PartialEq)]
pub struct Taken {
    /// Each change's kind and when it came.
    pub changes: Vec<(&'static str, Instant)>,
    /// The trigger times of the EndpointSlice changes among them.
    pub triggers: Vec<SystemTime>,
}

/// Shared by the watches (which record) and the agent's loop (which takes).
#[derive(Debug, Clone)]
pub struct ChangeStamps {
    started: SystemTime,
    taken: Arc<Mutex<Taken>>,
}

impl ChangeStamps {
    /// Trigger times before `started` (the agent's start) are not counted.
    pub fn new(started: SystemTime) -> Self {
        ChangeStamps {
            started,
            taken: Arc::default(),
        }
    }

    /// A change of `kind` came now; `trigger` is its trigger-time
    /// annotation, if it has one.
    pub fn record(&self, kind: &'static str, trigger: Option<&str>) {
        let trigger = trigger
            .and_then(parse_time)
            .filter(|time| *time >= self.started);
        let Ok(mut taken) = self.taken.lock() else {
            return;
        };
        if taken.changes.len() < MAX_STAMPS {
            taken.changes.push((kind, Instant::now()));
            taken.triggers.extend(trigger);
        }
    }

    /// What came since the last call.
    pub fn take(&self) -> Taken {
        self.taken
            .lock()
            .map(|mut taken| std::mem::take(&mut *taken))
            .unwrap_or_default()
    }
}

/// An RFC 3339 time as the API server writes it (`2026-11-29T21:00:00Z`,
/// with or without fractional seconds).
fn parse_time(text: &str) -> Option<SystemTime> {
    let timestamp: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(timestamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(latency: &ChangeLatency) -> String {
        let mut registry = Registry::default();
        latency.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn trigger_times_parse_with_and_without_fractions() {
        let whole = parse_time("2026-11-29T21:00:00Z").unwrap();
        let nanos = parse_time("2026-11-29T21:00:00.250000000Z").unwrap();
        assert_eq!(
            nanos.duration_since(whole).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn a_pass_observes_what_came_before_it_and_only_that() {
        let stamps = ChangeStamps::new(SystemTime::UNIX_EPOCH);
        let trigger = jiff::Timestamp::try_from(SystemTime::now() - Duration::from_secs(2))
            .unwrap()
            .to_string();
        stamps.record("EndpointSlice", Some(&trigger));
        stamps.record("NetworkPolicy", None);
        let taken = stamps.take();
        assert_eq!(taken.changes.len(), 2);
        assert_eq!(taken.triggers.len(), 1);
        // Came during the pass: left for the next one.
        stamps.record("Pod", None);
        let latency = ChangeLatency::default();
        latency.observe(taken, true);
        let text = rendered(&latency);
        assert!(
            text.contains("flatnet_change_to_datapath_seconds_count{kind=\"NetworkPolicy\"} 1"),
            "{text}"
        );
        assert!(!text.contains("kind=\"Pod\""), "{text}");
        assert!(
            text.contains("flatnet_network_programming_duration_seconds_count 1"),
            "{text}"
        );
        // Two seconds before the pass.
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("flatnet_network_programming_duration_seconds_sum "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((2.0..3.0).contains(&sum), "{sum}");
        assert_eq!(stamps.take().changes.len(), 1);
    }

    #[test]
    fn triggers_before_the_start_and_without_services_are_not_counted() {
        let stamps = ChangeStamps::new(SystemTime::now());
        stamps.record("EndpointSlice", Some("2020-01-01T00:00:00Z"));
        let taken = stamps.take();
        assert_eq!((taken.changes.len(), taken.triggers.len()), (1, 0));
        let stamps = ChangeStamps::new(SystemTime::UNIX_EPOCH);
        stamps.record("EndpointSlice", Some("2020-01-01T00:00:00Z"));
        let latency = ChangeLatency::default();
        latency.observe(stamps.take(), false);
        assert!(
            rendered(&latency).contains("flatnet_network_programming_duration_seconds_count 0")
        );
    }
}

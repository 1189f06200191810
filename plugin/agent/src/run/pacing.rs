//! When the next pass over the watched objects may run. A change after a
//! quiet spell is followed at once (a fixed gathering window would add its
//! length to every change's latency); changes during or right after a pass
//! wait until the loop has been free as long as that pass took, so passes
//! take at most half of the loop's time and a burst of events costs a few
//! passes, not one per event. A whole pass over a large cluster thereby
//! gathers more behind it than a cheap incremental one.

use std::time::{Duration, Instant};

/// The longest wait a slow pass imposes on the next: changes are never held
/// back longer than this by pacing alone.
const MAX_GAP: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// No pass before this (None: no pass has run yet).
    free_at: Option<Instant>,
}

impl Pacing {
    /// When a pass for a change seen at `now` is due.
    pub(super) fn due(&self, now: Instant) -> Instant {
        self.free_at.map_or(now, |free_at| free_at.max(now))
    }

    /// A pass ran from `started` to `ended`.
    pub(super) fn ran(&mut self, started: Instant, ended: Instant) {
        let took = ended.saturating_duration_since(started);
        self.free_at = Some(ended + took.min(MAX_GAP));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_change_after_a_quiet_spell_is_due_at_once() {
        let t0 = Instant::now();
        let mut pacing = Pacing::default();
        assert_eq!(pacing.due(t0), t0, "before any pass");
        pacing.ran(t0, t0 + 2 * MS);
        let later = t0 + 50 * MS;
        assert_eq!(pacing.due(later), later);
    }

    #[test]
    fn a_change_right_after_a_pass_waits_as_long_as_the_pass_took() {
        let t0 = Instant::now();
        let mut pacing = Pacing::default();
        pacing.ran(t0, t0 + 8 * MS);
        // Seen during the pass, and 1 ms after it.
        assert_eq!(pacing.due(t0 + 4 * MS), t0 + 16 * MS);
        assert_eq!(pacing.due(t0 + 9 * MS), t0 + 16 * MS);
    }

    #[test]
    fn a_slow_pass_holds_the_next_back_at_most_max_gap() {
        let t0 = Instant::now();
        let mut pacing = Pacing::default();
        pacing.ran(t0, t0 + 2000 * MS);
        assert_eq!(pacing.due(t0 + 2000 * MS), t0 + 2000 * MS + MAX_GAP);
    }
}

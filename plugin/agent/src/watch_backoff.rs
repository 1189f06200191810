//! The wait between a watch's tries, for every watch of the agent (Nodes,
//! and the kinds NetworkPolicy reads).

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

/// Whether `error` says the API server does not serve the kind's API
/// version (a 404 for its collection).
pub fn not_served(error: &watcher::Error) -> bool {
    status_code(error) == Some(404)
}

pub fn status_code(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        _ => None,
    }
}

/// The first wait after a watch's error, and the longest.
const FIRST_WAIT: Duration = Duration::from_millis(800);
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// How often an API server that does not serve an optional kind is asked
/// again: at 5,000 nodes, 83 requests a second for a CRD nobody installed
/// (each answered from the API server's memory), and a CRD installed later
/// is seen within this.
const NOT_SERVED_WAIT: Duration = Duration::from_secs(60);

pub type WatchEvent<K> = Result<Event<K>, watcher::Error>;

/// `events` with a wait after each error, doubling from [`FIRST_WAIT`] to
/// [`LONGEST_WAIT`], up to a quarter more at random (nodes restarted
/// together do not ask together). kube's own backoff is reset by every
/// `Ok`, and its watcher sends `Ok(Init)` before each list it tries: a list
/// that kept failing (a 403, a kind not served) was tried again about every
/// second. Here only what a served API sends (objects, a list's end, a
/// watch event) resets the wait.
pub fn backed_off<K: Send + 'static>(
    events: impl Stream<Item = WatchEvent<K>> + Send + 'static,
    optional: bool,
) -> impl Stream<Item = WatchEvent<K>> + Send {
    let start = (Box::pin(events), None::<Duration>, false);
    futures::stream::unfold(start, move |(mut events, wait, pause)| async move {
        if let (true, Some(wait)) = (pause, wait) {
            tokio::time::sleep(wait + jitter(wait)).await;
        }
        let event = events.next().await?;
        let (wait, pause) = next_wait(wait, &event, optional);
        Some((event, (events, wait, pause)))
    })
}

/// The wait after `event` (None: none owed), and whether to wait before
/// the next one.
fn next_wait<K>(
    wait: Option<Duration>,
    event: &WatchEvent<K>,
    optional: bool,
) -> (Option<Duration>, bool) {
    match event {
        Err(error) if optional && not_served(error) => (Some(NOT_SERVED_WAIT), true),
        Err(_) => {
            let longer = wait.map_or(FIRST_WAIT, |w| (w * 2).clamp(FIRST_WAIT, LONGEST_WAIT));
            (Some(longer), true)
        }
        // The watcher's next try at a list: the wait owed stays.
        Ok(Event::Init) => (wait, false),
        Ok(_) => (None, false),
    }
}

/// Up to a quarter of `wait`, from the clock's nanoseconds.
fn jitter(wait: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    wait.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;

    use super::*;

    fn failed(code: u16) -> WatchEvent<Namespace> {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "x", "code": code, "message": "x"
        }))
        .unwrap();
        Err(watcher::Error::InitialListFailed(kube::Error::Api(
            Box::new(status),
        )))
    }

    #[test]
    fn a_list_that_keeps_failing_waits_longer_each_time_though_each_try_begins_with_init() {
        let mut wait = None;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let (after_init, pause) = next_wait(wait, &Ok(Event::<Namespace>::Init), false);
            assert!(!pause);
            let (after_error, pause) = next_wait(after_init, &failed(403), false);
            assert!(pause);
            wait = after_error;
            waits.push(wait.unwrap().as_millis());
        }
        assert_eq!(waits, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        // What a served API sends resets it.
        let (reset, pause) = next_wait(wait, &Ok(Event::<Namespace>::InitDone), false);
        assert_eq!((reset, pause), (None, false));
    }

    #[test]
    fn an_optional_kind_not_served_is_asked_again_a_minute_later() {
        assert_eq!(
            next_wait(None, &failed(404), true),
            (Some(NOT_SERVED_WAIT), true)
        );
        // A required kind not served waits as for any error.
        assert_eq!(
            next_wait(None, &failed(404), false),
            (Some(FIRST_WAIT), true)
        );
        assert_eq!(NOT_SERVED_WAIT, Duration::from_secs(60));
    }
}

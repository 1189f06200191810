//! One integration test binary, the concurrency of one binary per file:
//! the tests of one file (the module under the binary's root) run side by
//! side, as libtest runs a binary's tests, and a test of another file waits
//! until none of them is running. Tests of one file share assumptions
//! about the node (the host's forwarding switches, a cluster of their own)
//! that tests of another file may not keep while they run.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The file whose tests run now, and how many of them.
static RUNNING: Mutex<(Option<String>, usize)> = Mutex::new((None, 0));
static CHANGED: Condvar = Condvar::new();

fn running() -> MutexGuard<'static, (Option<String>, usize)> {
    // A test that panicked holding the lock poisoned nothing we keep.
    RUNNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The file of a test's `module_path!()`: `integration::programs::nat`
/// -> `integration::programs`.
pub fn file_of(module_path: &str) -> String {
    module_path
        .splitn(3, "::")
        .take(2)
        .collect::<Vec<_>>()
        .join("::")
}

/// Held while a test runs: its file's tests may run beside it.
pub struct Gate;

/// Waits until no test of another file runs, then lets this one in.
pub fn enter(module_path: &str) -> Gate {
    // The first test also sees to it that a signal ending the run (a CI
    // timeout, ^C) still removes the namespaces, mounts and networks the
    // running tests made.
    static ON_SIGNAL: std::sync::Once = std::sync::Once::new();
    ON_SIGNAL.call_once(|| {
        if let Err(e) = crate::remove_on_signal() {
            eprintln!("no clean-up on signals: {e}");
        }
    });
    let file = file_of(module_path);
    let mut state = running();
    while state.0.as_ref().is_some_and(|open| *open != file) {
        state = CHANGED
            .wait(state)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    state.0 = Some(file);
    state.1 += 1;
    Gate
}

impl Drop for Gate {
    fn drop(&mut self) {
        let mut state = running();
        state.1 -= 1;
        if state.1 == 0 {
            state.0 = None;
            CHANGED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn a_file_is_its_first_two_path_segments() {
        assert_eq!(
            file_of("integration::programs::nat"),
            "integration::programs"
        );
        assert_eq!(file_of("integration::spec"), "integration::spec");
    }

    #[test]
    fn tests_of_one_file_overlap_and_another_file_waits() {
        let first = enter("it::a");
        let second = enter("it::a::sub");
        let entered = Arc::new(AtomicUsize::new(0));
        let waiter = {
            let entered = entered.clone();
            std::thread::spawn(move || {
                let _gate = enter("it::b");
                entered.store(1, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            entered.load(Ordering::SeqCst),
            0,
            "b ran while a's tests ran"
        );
        drop(first);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            entered.load(Ordering::SeqCst),
            0,
            "b ran while one of a's ran"
        );
        drop(second);
        waiter.join().unwrap();
        assert_eq!(entered.load(Ordering::SeqCst), 1);
    }
}

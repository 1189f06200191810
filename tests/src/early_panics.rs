//! A test's panic written out the moment it happens, besides the copy
//! libtest prints with the failures at the end: a run cut short (killed,
//! or a later test hanging until a timeout) still says why a test failed.
//! Run D of stop 51 lost the reason of a failure that way.

use std::io::Write;
use std::sync::Once;

/// Installs the hook once per test binary; the earlier hook (libtest's
/// captured copy, `remove_on_signal`'s) still runs after it.
pub fn print_panics_at_once() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let earlier = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("a thread a test started");
            // Straight to the descriptor: libtest captures only the print
            // macros and the panic messages it is handed.
            let _ = writeln!(std::io::stderr().lock(), "\n[panic in {name}] {info}");
            earlier(info);
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "early_panics::tests::a_failing_test_run_as_a_child";

    /// Fails on purpose when run by the test below, under libtest's
    /// capture as every test is.
    #[test]
    #[ignore = "run by prints_a_panic_before_the_failures_list as a child"]
    fn a_failing_test_run_as_a_child() {
        print_panics_at_once();
        assert!(
            std::env::var_os("FLATNET_EARLY_PANIC").is_none(),
            "the reason"
        );
    }

    #[test]
    fn prints_a_panic_before_the_failures_list() {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", CHILD, "--test-threads=1"])
            .env("FLATNET_EARLY_PANIC", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&child.stderr);
        let stdout = String::from_utf8_lossy(&child.stdout);
        assert!(!child.status.success(), "{stdout}");
        // Written at once to stderr; libtest's own copy comes in stdout's
        // list of failures, after the run.
        assert!(
            stderr.contains(&format!("[panic in {CHILD}]")) && stderr.contains("the reason"),
            "stderr: {stderr}"
        );
        assert!(stdout.contains("failures:"), "{stdout}");
    }
}

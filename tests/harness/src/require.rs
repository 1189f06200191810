//! A test that cannot run here (not root, a tool missing): a loud skip for
//! a developer's plain `cargo test`, a failure where every test must run
//! (`cargo xtask test`, CI), so that a suite that ran nothing never
//! reports ok there.

/// Set to 1 (as `cargo xtask test` does) and a test that cannot run fails
/// instead of skipping. `CI=true` does the same.
pub const REQUIRE_ROOT_ENV: &str = "FLATNET_REQUIRE_ROOT";

/// What a test does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Run,
    /// Return early, after a loud line.
    Skip,
    /// Panic, saying why the test cannot run.
    Fail,
}

/// The rule: run when the test can (`can_run`: root, the tools there);
/// otherwise fail when the environment (`env`: a variable's value, if set)
/// asks for every test to run (`FLATNET_REQUIRE_ROOT` 1 or true, or `CI`
/// true or 1), else skip.
pub fn verdict(can_run: bool, env: impl Fn(&str) -> Option<String>) -> Verdict {
    if can_run {
        return Verdict::Run;
    }
    let set = |key: &str| {
        env(key)
            .is_some_and(|value| matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true"))
    };
    if set(REQUIRE_ROOT_ENV) || set("CI") {
        Verdict::Fail
    } else {
        Verdict::Skip
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether `test` runs: true when `can_run`; otherwise a loud `SKIPPED`
/// line and false, or, where every test must run (see [`verdict`]), a
/// panic saying `why` it cannot.
#[track_caller]
pub fn require(test: &str, can_run: bool, why: &str) -> bool {
    match verdict(can_run, |key| std::env::var(key).ok()) {
        Verdict::Run => true,
        Verdict::Skip => {
            eprintln!("\n\x1b[1;33mSKIPPED {test}: {why}\x1b[0m\n");
            false
        }
        Verdict::Fail => panic!(
            "{test} cannot run: {why}. With {REQUIRE_ROOT_ENV}=1 (`cargo xtask test` sets it) \
             or CI=true a test that cannot run fails instead of skipping"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn root_runs_whatever_the_environment() {
        for env in [&[][..], &[("FLATNET_REQUIRE_ROOT", "1")], &[("CI", "true")]] {
            assert_eq!(verdict(true, with(env)), Verdict::Run);
        }
    }

    #[test]
    fn not_root_skips_in_a_plain_cargo_test() {
        assert_eq!(verdict(false, with(&[])), Verdict::Skip);
        assert_eq!(
            verdict(false, with(&[("FLATNET_REQUIRE_ROOT", "0")])),
            Verdict::Skip
        );
        assert_eq!(verdict(false, with(&[("CI", "false")])), Verdict::Skip);
        assert_eq!(verdict(false, with(&[("CI", "")])), Verdict::Skip);
    }

    #[test]
    fn not_root_fails_under_xtask_and_ci() {
        for env in [
            &[("FLATNET_REQUIRE_ROOT", "1")][..],
            &[("FLATNET_REQUIRE_ROOT", "true")],
            &[("CI", "true")],
            &[("CI", "1")],
            &[("CI", "TRUE")],
            &[("FLATNET_REQUIRE_ROOT", "0"), ("CI", "true")],
        ] {
            assert_eq!(verdict(false, with(env)), Verdict::Fail, "{env:?}");
        }
    }

    #[test]
    fn require_runs_what_can_run() {
        assert!(require("a test", true, "needs nothing"));
    }
}

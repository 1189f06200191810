//! What a test needs before it runs (root, tools on the machine) and the
//! verdict when the machine lacks it: a SKIPPED line, or a panic.

use std::path::Path;

use crate::{REFERENCE_PLUGINS, is_root, require};

/// A tool a test needs: an absolute path or a program on PATH, with the
/// Debian package that brings it when the message should name one.
pub trait Needed {
    fn tool(&self) -> &str;
    fn package(&self) -> Option<&str> {
        None
    }
}

impl Needed for &str {
    fn tool(&self) -> &str {
        self
    }
}

impl Needed for (&str, &str) {
    fn tool(&self) -> &str {
        self.0
    }
    fn package(&self) -> Option<&str> {
        Some(self.1)
    }
}

impl Needed for (String, &str) {
    fn tool(&self) -> &str {
        &self.0
    }
    fn package(&self) -> Option<&str> {
        Some(self.1)
    }
}

/// The reference plugins `names` in REFERENCE_PLUGINS, as a test's tools.
pub fn reference_plugins(names: &[&str]) -> Vec<(String, &'static str)> {
    names
        .iter()
        .map(|name| {
            (
                format!("{REFERENCE_PLUGINS}/{name}"),
                "containernetworking-plugins",
            )
        })
        .collect()
}

/// What `#[flatnet_test]` checks before a test runs: root when `root`,
/// and each of `tools` (an absolute path, or a program on PATH). False
/// after a loud SKIPPED line, or, under `cargo xtask test` and in CI, a
/// panic naming what is missing and the package to install.
#[track_caller]
pub fn requirements<T: Needed>(test: &str, root: bool, tools: &[T]) -> bool {
    crate::early_panics::print_panics_at_once();
    if root && !root_or_skip(test) {
        return false;
    }
    let missing = tools.iter().find(|needed| !tool_exists(needed.tool()));
    let why = match missing {
        None => String::new(),
        Some(needed) => match needed.package() {
            Some(package) => format!(
                "{} is missing (apt-get install {package}, or `cargo xtask setup`)",
                needed.tool()
            ),
            None => format!("{} is missing (not found on PATH)", needed.tool()),
        },
    };
    require(test, missing.is_none(), &why)
}

/// An absolute path that exists, or a program found on PATH.
pub fn tool_exists(tool: &str) -> bool {
    let path = Path::new(tool);
    if path.is_absolute() {
        return path.exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|dirs| std::env::split_paths(&dirs).any(|dir| dir.join(tool).is_file()))
}

/// True when root; otherwise false after a loud SKIPPED line (the test
/// then returns early), or, under `cargo xtask test` and in CI, a panic.
#[track_caller]
fn root_or_skip(test: &str) -> bool {
    require(
        test,
        is_root(),
        "needs root for network namespaces, veths and BPF",
    )
}

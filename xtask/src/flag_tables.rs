//! The docs' flag tables against the commands themselves: every table under
//! a `<!-- flags: <command> -->` line in docs/ lists flags in its first
//! column, and each must be in that command's `--help`, and each option of
//! the `--help` in the table, so a renamed, removed or added flag cannot
//! leave the docs behind. The help comes from the built binaries (the env
//! var FLATNET_BIN_DIR, else target/debug) and, for `cargo xtask`, from
//! clap's own description of this crate's CLI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;

const MARKER: &str = "<!-- flags: ";

/// Commands whose flags the docs must list in a table.
const REQUIRED: &[&str] = &[
    "flatnet inspect",
    "flatnet monitor",
    "flatnet repair",
    "flatnet-agent",
    "cargo xtask test",
    "cargo xtask bench",
    "cargo xtask e2e",
];

/// One table: the command it documents, where, and its first column.
#[derive(Debug)]
struct FlagTable {
    command: String,
    page: String,
    entries: Vec<String>,
}

/// The flag a first-column cell names: its first backticked word
/// (`--bin-dir DIR` is `--bin-dir`; `FILTER` an argument).
fn cell_flag(cell: &str) -> Option<String> {
    let inside = cell.split('`').nth(1)?;
    inside.split_whitespace().next().map(str::to_string)
}

fn tables(page: &str, text: &str) -> Vec<FlagTable> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim().strip_prefix(MARKER) else {
            continue;
        };
        let command = rest.trim_end_matches("-->").trim().to_string();
        let entries = lines[at + 1..]
            .iter()
            .skip_while(|l| l.trim().is_empty())
            .take_while(|l| l.trim_start().starts_with('|'))
            // The header and its separator line.
            .skip(2)
            .filter_map(|l| l.trim().trim_start_matches('|').split('|').next())
            .filter_map(cell_flag)
            .collect();
        found.push(FlagTable {
            command,
            page: page.to_string(),
            entries,
        });
    }
    found
}

fn docs_tables() -> Vec<FlagTable> {
    let docs = crate::util::root().join("docs");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap_or_else(|e| panic!("reading {}: {e}", docs.display()))
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            tables(&path.display().to_string(), &text)
        })
        .collect()
}

fn bin_dir() -> PathBuf {
    std::env::var_os("FLATNET_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::util::root().join("target/debug"))
}

/// The `--help` of a built binary (`flatnet-agent`, or `flatnet` with its
/// subcommand); a missing binary fails the test, naming the build to run.
fn binary_help(dir: &Path, words: &[&str]) -> String {
    let binary = dir.join(words[0]);
    assert!(
        binary.is_file(),
        "{} is missing: build first (cargo build -p flatnet -p flatnet-agent), or set FLATNET_BIN_DIR to where the binaries are",
        binary.display()
    );
    let output = Command::new(&binary)
        .args(&words[1..])
        .arg("--help")
        // With CNI_COMMAND set, flatnet is a CNI plugin, not the CLI.
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap_or_else(|e| panic!("running {} --help: {e}", binary.display()));
    assert!(
        output.status.success(),
        "{} {} --help failed: {}",
        binary.display(),
        words[1..].join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `cargo xtask <task> --help`, from clap's description of the CLI.
fn xtask_help(task: &str) -> String {
    let mut cli = crate::Cli::command();
    let sub = cli
        .find_subcommand_mut(task)
        .unwrap_or_else(|| panic!("cargo xtask has no task {task:?}"));
    sub.render_long_help().to_string()
}

fn help(command: &str) -> String {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["cargo", "xtask", task] => xtask_help(task),
        [] => panic!("an empty flags marker"),
        _ => binary_help(&bin_dir(), &words),
    }
}

/// The options a help text defines (its option lines, not flags its
/// descriptions mention), without --help and --version.
fn defined_options(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line
                .strip_prefix('-')
                .filter(|rest| !rest.starts_with('-'))
                .and_then(|rest| rest.split_once(", "))
                .map_or(line, |(_, long)| long);
            let flag = line.strip_prefix("--")?;
            let name: String = flag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect()
}

#[test]
fn cell_flags_and_option_lines_are_read() {
    assert_eq!(cell_flag(" `--bin-dir DIR` "), Some("--bin-dir".into()));
    assert_eq!(cell_flag(" `FILTER` (argument) "), Some("FILTER".into()));
    let help = "Options:\n      --network <NETWORK>  Only this (see --json)\n  -j, --json  out\n  -h, --help  Print help\n  -V, --version\n";
    let options: Vec<String> = defined_options(help).into_iter().collect();
    assert_eq!(options, ["--json", "--network"]);
    let page = "<!-- flags: x -->\n| flag | meaning |\n|---|---|\n| `--a N` | a |\n| `--b` | b |\n\ntext\n";
    let found = tables("p", page);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].entries, ["--a", "--b"]);
}

#[test]
fn every_documented_flag_exists_and_every_flag_is_documented() {
    let tables = docs_tables();
    let documented: BTreeSet<&str> = tables.iter().map(|t| t.command.as_str()).collect();
    for command in REQUIRED {
        assert!(
            documented.contains(command),
            "docs/ has no flag table for `{command}` (a table under <!-- flags: {command} -->)"
        );
    }
    let mut problems = Vec::new();
    for table in &tables {
        assert!(
            !table.entries.is_empty(),
            "{}: the table under <!-- flags: {} --> lists no flag",
            table.page,
            table.command
        );
        let help = help(&table.command);
        let options = defined_options(&help);
        for entry in &table.entries {
            let known = if entry.starts_with("--") {
                options.contains(entry)
            } else {
                // A positional argument: clap shows it as [NAME] or <NAME>.
                help.contains(&format!("[{entry}]")) || help.contains(&format!("<{entry}>"))
            };
            if !known {
                problems.push(format!(
                    "{}: `{}` documents {entry}, which its --help does not have",
                    table.page, table.command
                ));
            }
        }
        for option in &options {
            if !table.entries.contains(option) {
                problems.push(format!(
                    "{}: `{}` has {option}, which its flag table does not list",
                    table.page, table.command
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

//! The code map in docs/development.md: every Rust file of the repository,
//! by directory, beside the opening clause of its `//!` doc, written by
//! `cargo xtask docs` between the `<!-- code-layout -->` lines so that the
//! map cannot fall behind the tree. A file's description is changed in the
//! file itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

use crate::markers::Section;

/// The page the map is on, from the repository's root.
const PAGE: &str = "docs/development.md";
const START: &str = "<!-- code-layout -->";
const END: &str = "<!-- /code-layout -->";
/// No line of the section is longer than this, in characters.
const WIDTH: usize = 100;
/// An opening clause shorter than this ("ADD:", "Links:") is a label, and
/// the description runs on to the next clause's end.
const SHORTEST_CLAUSE: usize = 20;
/// The files listed first in their directory: its module's root.
const MODULE_ROOTS: [&str; 3] = ["lib.rs", "main.rs", "mod.rs"];

const SECTION: Section = Section {
    page: PAGE,
    what: "the code map",
    start: START,
    end: END,
};

/// The `.rs` files git knows of (tracked, or new and not ignored) that are
/// on disk, relative to `root`, sorted.
fn rust_files(root: &Path) -> anyhow::Result<Vec<String>> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            "*.rs",
        ])
        .output()
        .context("cannot run `git ls-files`")?;
    if !output.status.success() {
        bail!(
            "`git ls-files` failed in {}: {}",
            root.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let listed = String::from_utf8(output.stdout).context("`git ls-files` printed non-UTF-8")?;
    let files: BTreeSet<&str> = listed
        .split('\0')
        .filter(|path| !path.is_empty() && root.join(path).is_file())
        .collect();
    Ok(files.into_iter().map(str::to_string).collect())
}

/// The first paragraph of a file's leading `//!` lines, joined into one
/// line; `None` when the file does not start with one.
fn first_paragraph(source: &str) -> Option<String> {
    let mut lines = source.lines().skip_while(|line| line.trim().is_empty());
    let mut words = Vec::new();
    for line in lines.by_ref() {
        let Some(text) = line.trim().strip_prefix("//!") else {
            break;
        };
        let text = text.trim();
        if text.is_empty() {
            if words.is_empty() {
                continue;
            }
            break;
        }
        words.push(text);
    }
    (!words.is_empty()).then(|| words.join(" "))
}

/// Whether the clause may end at `chars[at]`: a colon, semicolon, full
/// stop or question mark before a space or the end, or a dash between
/// spaces.
fn ends_clause(chars: &[char], at: usize) -> bool {
    let next_is_space = chars.get(at + 1).is_none_or(|next| *next == ' ');
    let before = &chars[..at];
    match chars[at] {
        ':' | ';' | '?' => next_is_space,
        // Not an abbreviation's stop, nor an ellipsis.
        '.' => {
            next_is_space
                && !before.ends_with(&['e', '.', 'g'])
                && !before.ends_with(&['i', '.', 'e'])
                && !before.ends_with(&['.'])
        }
        '—' => next_is_space && before.ends_with(&[' ']),
        _ => false,
    }
}

/// `[`name`]` (an intra-doc link) as plain `name` in backticks: the map is
/// not rustdoc.
fn without_doc_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("[`") {
        let after = &rest[at + 1..];
        let Some(close) = after[1..].find("`]").map(|c| c + 1) else {
            break;
        };
        let follows = after[close + 2..].chars().next();
        out.push_str(&rest[..at]);
        if matches!(follows, Some('(' | '[')) {
            out.push_str(&rest[at..at + 1 + close + 2]);
        } else {
            out.push_str(&after[..=close]);
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    out
}

/// What the map says of a file: its first `//!` paragraph up to the end of
/// the first clause outside brackets and code that is at least
/// [`SHORTEST_CLAUSE`] long, without its closing punctuation.
fn describe(paragraph: &str) -> String {
    let chars: Vec<char> = paragraph.chars().collect();
    let (mut depth, mut code) = (0usize, false);
    let mut clause = chars.len();
    for (at, c) in chars.iter().enumerate() {
        match c {
            '`' => code = !code,
            '(' | '[' | '{' if !code => depth += 1,
            ')' | ']' | '}' if !code => depth = depth.saturating_sub(1),
            _ if code || depth > 0 || !ends_clause(&chars, at) => {}
            _ => {
                // A question keeps its mark; a dash goes with its space.
                let end = match c {
                    '—' => at - 1,
                    '?' => at + 1,
                    _ => at,
                };
                if end >= SHORTEST_CLAUSE {
                    clause = end;
                    break;
                }
            }
        }
    }
    let text: String = chars[..clause].iter().collect();
    without_doc_links(text.trim_end().trim_end_matches(['.', ':', ';']))
}

/// `text` in lines of at most `width` characters, broken between words (a
/// word longer than a line is broken where the line ends).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        let used = line.chars().count();
        if used > 0 && used + 1 + word.len() <= width {
            line.push(' ');
            line.extend(&word);
            continue;
        }
        if used > 0 {
            lines.push(std::mem::take(&mut line));
        }
        while word.len() > width {
            lines.push(word.drain(..width).collect());
        }
        line.extend(&word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// The package a `Cargo.toml` declares, if any (a workspace's has none).
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "name"
        {
            return Some(value.trim().trim_matches('"').to_string());
        }
    }
    None
}

/// One line of the tree before it is laid out: indent, name, description.
struct Entry {
    depth: usize,
    name: String,
    text: Option<String>,
}

/// The tree of `files` (path and description): each directory (a crate's
/// named by its package, from `crates`), then its files, module root first,
/// then its subdirectories, in name order.
fn entries(files: &[(String, String)], crates: &BTreeMap<String, String>) -> Vec<Entry> {
    let mut files_in: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    let mut subdirs: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (path, text) in files {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        files_in.entry(dir).or_default().push((name, text));
        let mut child = dir;
        while !child.is_empty() {
            let parent = child.rsplit_once('/').map_or("", |(parent, _)| parent);
            subdirs.entry(parent).or_default().insert(child);
            child = parent;
        }
    }
    let mut out = Vec::new();
    let mut stack: Vec<(&str, usize)> = vec![("", 0)];
    while let Some((dir, depth)) = stack.pop() {
        let mut depth_of_contents = depth;
        if !dir.is_empty() {
            out.push(Entry {
                depth,
                name: format!("{}/", dir.rsplit('/').next().unwrap_or(dir)),
                text: crates.get(dir).map(|name| format!("crate {name}")),
            });
            depth_of_contents += 1;
        }
        let mut here = files_in.get(dir).cloned().unwrap_or_default();
        here.sort_by_key(|(name, _)| (!MODULE_ROOTS.contains(name), *name));
        for (name, text) in here {
            out.push(Entry {
                depth: depth_of_contents,
                name: name.to_string(),
                text: Some(text.to_string()),
            });
        }
        if let Some(children) = subdirs.get(dir) {
            stack.extend(children.iter().rev().map(|c| (*c, depth_of_contents)));
        }
    }
    out
}

/// The fenced map: names indented two spaces a level, descriptions in one
/// column, wrapped within [`WIDTH`] with continuation lines under the text.
fn layout(entries: &[Entry]) -> String {
    let label_width = |e: &Entry| 2 * e.depth + e.name.chars().count();
    let column = entries
        .iter()
        .filter(|e| e.text.is_some())
        .map(label_width)
        .max()
        .unwrap_or(0)
        + 2;
    let mut out = String::from("```\n");
    for entry in entries {
        let label = format!("{}{}", "  ".repeat(entry.depth), entry.name);
        let Some(text) = &entry.text else {
            out.push_str(&label);
            out.push('\n');
            continue;
        };
        for (at, line) in wrap(text, WIDTH.saturating_sub(column)).iter().enumerate() {
            let lead = if at == 0 { label.as_str() } else { "" };
            let _ = writeln!(out, "{lead:column$}{line}");
        }
    }
    out.push_str("```\n");
    out
}

/// What goes between the markers for `files` (path, first `//!` paragraph)
/// and the crates' names by directory.
fn section(files: &[(String, String)], crates: &BTreeMap<String, String>) -> String {
    let described: Vec<(String, String)> = files
        .iter()
        .map(|(path, paragraph)| (path.clone(), describe(paragraph)))
        .collect();
    let intro = format!(
        "Every Rust file, under its directory, beside the opening clause of its first `//!` \
         paragraph: up to the first colon, semicolon, full stop, question mark or dash outside \
         brackets and code that ends at least {SHORTEST_CLAUSE} characters in (so a label such \
         as `ADD:` runs on). Written by `cargo xtask docs` (xtask/src/code_map.rs): a file's \
         description is changed in the file itself."
    );
    let intro = wrap(&intro, WIDTH).join("\n");
    format!("\n{intro}\n\n{}\n", layout(&entries(&described, crates)))
}

/// The map of the repository at `root`, as [`section`] writes it.
fn generate(root: &Path) -> anyhow::Result<String> {
    let mut files = Vec::new();
    let mut crates = BTreeMap::new();
    for path in rust_files(root)? {
        let source =
            std::fs::read_to_string(root.join(&path)).with_context(|| format!("reading {path}"))?;
        let paragraph = first_paragraph(&source).with_context(|| {
            format!("{path} does not start with a `//!` line saying what it holds")
        })?;
        files.push((path, paragraph));
    }
    let dirs: BTreeSet<&str> = files
        .iter()
        .flat_map(|(path, _)| path.match_indices('/').map(move |(at, _)| &path[..at]))
        .collect();
    for dir in dirs {
        if let Ok(manifest) = std::fs::read_to_string(root.join(dir).join("Cargo.toml"))
            && let Some(name) = package_name(&manifest)
        {
            crates.insert(dir.to_string(), name);
        }
    }
    Ok(section(&files, &crates))
}

/// Rewrites the code map in `<root>/docs/development.md`.
pub fn write(root: &Path) -> anyhow::Result<()> {
    let path = root.join(PAGE);
    let page =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let updated = SECTION.replace(&page, &generate(root)?)?;
    std::fs::write(&path, updated)?;
    println!("wrote the code map in {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_paragraph_is_joined_and_stops_at_a_blank_line() {
        let source = "\n//! One line\n//!   and the next.\n//!\n//! Not this.\nfn f() {}\n";
        assert_eq!(
            first_paragraph(source).as_deref(),
            Some("One line and the next.")
        );
        assert_eq!(
            first_paragraph("//! Only.\nuse x;\n").as_deref(),
            Some("Only.")
        );
        assert_eq!(first_paragraph("use x;\n//! Too late.\n"), None);
        assert_eq!(first_paragraph("/// An item's doc.\nfn f() {}\n"), None);
    }

    #[test]
    fn a_description_is_the_opening_clause() {
        for (paragraph, described) in [
            (
                "The benchmark's report: medians and ratios.",
                "The benchmark's report",
            ),
            // A short label runs on to the next clause.
            (
                "ADD: the veth pair made while IPAM runs. Then more.",
                "ADD: the veth pair made while IPAM runs",
            ),
            // Nothing in brackets or code ends it; abbreviations do not.
            (
                "Topology (`a`: PreferClose, e.g. this; that), as kube-proxy does: more",
                "Topology (`a`: PreferClose, e.g. this; that), as kube-proxy does",
            ),
            (
                "Calls into `bpf_ct_lookup: x.` kfuncs, Linux 6.0+",
                "Calls into `bpf_ct_lookup: x.` kfuncs, Linux 6.0+",
            ),
            (
                "`cargo xtask`: everything around the code — set-up, build",
                "`cargo xtask`: everything around the code",
            ),
            (
                "The cluster's addresses and names.",
                "The cluster's addresses and names",
            ),
            (
                "[`SimNode`]: one simulated node, [`x`](y) kept: more",
                "`SimNode`: one simulated node, [`x`](y) kept",
            ),
        ] {
            assert_eq!(describe(paragraph), described, "{paragraph}");
        }
    }

    #[test]
    fn wrapping_keeps_words_whole_and_lines_short() {
        assert_eq!(
            wrap("aa bb cc dd", 5),
            vec!["aa bb".to_string(), "cc dd".to_string()]
        );
        assert_eq!(
            wrap("abcdefgh ij", 3),
            vec!["abc", "def", "gh", "ij"]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        );
        assert_eq!(wrap("", 10), vec![String::new()]);
    }

    #[test]
    fn a_crate_is_named_by_its_package() {
        let manifest = "[package]\nname = \"flatnet-cni\"\n\n[dependencies]\nname = \"x\"\n";
        assert_eq!(package_name(manifest).as_deref(), Some("flatnet-cni"));
        assert_eq!(package_name("[workspace]\nmembers = []\n"), None);
    }

    #[test]
    fn the_tree_lists_directories_then_their_files_module_root_first() {
        let files: Vec<(String, String)> = [
            ("a/src/zeta.rs", "Zeta: the last file here, a long description that goes on and on past the width of one line of the map."),
            ("a/src/lib.rs", "The crate's root."),
            ("a/src/sub/mod.rs", "The sub module."),
            ("b/build.rs", "Builds it."),
        ]
        .into_iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect();
        let crates = BTreeMap::from([("a".to_string(), "crate-a".to_string())]);
        let section = section(&files, &crates);
        let map = section.split("```\n").nth(1).unwrap_or_default();
        let zeta_text = "Zeta: the last file here, a long description that goes on and on past the width of one line of the map";
        // The longest named line with a text is "      mod.rs" (12), and
        // the texts start two columns after it.
        let zeta = wrap(zeta_text, WIDTH - 14);
        let mut expected = [
            "a/            crate crate-a",
            "  src/",
            "    lib.rs    The crate's root",
        ]
        .join("\n");
        expected.push('\n');
        expected.push_str(&format!("    zeta.rs   {}\n", zeta[0]));
        for line in &zeta[1..] {
            expected.push_str(&format!("{:14}{line}\n", ""));
        }
        for line in [
            "    sub/",
            "      mod.rs  The sub module",
            "b/",
            "  build.rs    Builds it",
        ] {
            expected.push_str(line);
            expected.push('\n');
        }
        assert_eq!(map, expected);
        assert!(zeta.len() > 1);
        for line in section.lines() {
            assert!(line.chars().count() <= WIDTH, "{line}");
        }
    }

    #[test]
    fn the_map_is_replaced_between_its_markers() -> anyhow::Result<()> {
        crate::markers::checks::replaces_between_its_markers(&SECTION, "\nnew map\n\n")
    }

    /// The committed map is exactly what the generator writes from the
    /// tree: a hand edit, or a file added, renamed or redescribed without
    /// running the generator, fails here.
    #[test]
    fn committed_code_map_matches_the_tree() -> anyhow::Result<()> {
        let root = crate::util::root();
        let page = std::fs::read_to_string(root.join(PAGE))?;
        let map = generate(&root)?;
        for line in map.lines() {
            assert!(line.chars().count() <= WIDTH, "longer than {WIDTH}: {line}");
        }
        assert!(
            page == SECTION.replace(&page, &map)?,
            "the code map in {PAGE} differs from what `cargo xtask docs` writes from the tree's `//!` lines: run `cargo xtask docs`"
        );
        Ok(())
    }
}

//! The Kubernetes source tree: Debian's source package, fetched from the
//! mirror this machine already uses with a private apt setup, unpacked and patched.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::Layout;
use super::internet_check::patch_networking;
use crate::util::{heading, run_cmd};

/// The source package, pinned: the cache folder is named after what it holds.
pub(super) const SOURCE_PACKAGE: &str = "kubernetes";
pub(super) const SOURCE_VERSION: &str = "1.20.5+really1.20.2-1.1+deb12u1";
const ORIG_TARBALL_PREFIX: &str = "kubernetes_1.20.5+really1.20.2.orig.tar.";
const SUITE: &str = "bookworm";

// --- The Kubernetes source --------------------------------------------------

/// One `deb` entry of the system's apt sources.
#[derive(Debug, PartialEq)]
struct AptEntry {
    uri: String,
    suites: Vec<String>,
    components: Vec<String>,
    signed_by: Option<String>,
}

impl AptEntry {
    fn serves(&self, suite: &str, component: &str) -> bool {
        self.suites.iter().any(|s| s == suite) && self.components.iter().any(|c| c == component)
    }
}

/// One-line format: `deb [opt=value ...] URI suite component...`.
fn parse_one_line(text: &str) -> Vec<AptEntry> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            continue;
        }
        let mut signed_by = None;
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for word in words.by_ref() {
                let option = word.trim_start_matches('[').trim_end_matches(']');
                if let Some(value) = option.strip_prefix("signed-by=") {
                    signed_by = Some(value.to_string());
                }
                if word.ends_with(']') {
                    break;
                }
            }
        }
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        entries.push(AptEntry {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
            signed_by,
        });
    }
    entries
}

/// deb822 format (`.sources`): stanzas of `Field: value` separated by blank
/// lines; continuation lines start with white space.
fn parse_deb822(text: &str) -> Vec<AptEntry> {
    let mut entries = Vec::new();
    for stanza in text.split("\n\n") {
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push('\n');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':') {
                fields.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let field = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let words = |name: &str| -> Vec<String> {
            field(name)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let enabled = field("enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        if !enabled || !words("types").iter().any(|t| t == "deb") {
            continue;
        }
        // Signed-By is a keyring path or an inline key; only a path fits a
        // one-line entry (apt's trusted keyrings cover the other case).
        let signed_by = field("signed-by")
            .filter(|v| !v.contains('\n') && !v.contains(' '))
            .map(str::to_string);
        for uri in words("uris") {
            entries.push(AptEntry {
                uri,
                suites: words("suites"),
                components: words("components"),
                signed_by: signed_by.clone(),
            });
        }
    }
    entries
}

/// The system's own `deb` entries, in the order apt reads them.
fn system_apt_entries() -> anyhow::Result<Vec<AptEntry>> {
    let mut entries = Vec::new();
    let main = Path::new("/etc/apt/sources.list");
    if main.exists() {
        let text =
            fs::read_to_string(main).with_context(|| format!("cannot read {}", main.display()))?;
        entries.extend(parse_one_line(&text));
    }
    let parts = Path::new("/etc/apt/sources.list.d");
    if parts.is_dir() {
        let mut files: Vec<PathBuf> = fs::read_dir(parts)
            .with_context(|| format!("cannot read {}", parts.display()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .collect();
        files.sort();
        for file in files {
            // apt reads only these two extensions; others are disabled.
            let parse: fn(&str) -> Vec<AptEntry> = match file.extension().and_then(|e| e.to_str()) {
                Some("list") => parse_one_line,
                Some("sources") => parse_deb822,
                _ => continue,
            };
            let text = fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            entries.extend(parse(&text));
        }
    }
    Ok(entries)
}

/// The private sources list: the `deb-src` twin of the system's bookworm
/// main entry, so the source comes from the mirror the machine already uses.
fn source_list_line(entries: &[AptEntry]) -> anyhow::Result<String> {
    let entry = entries
        .iter()
        .find(|entry| entry.serves(SUITE, "main"))
        .with_context(|| {
            format!(
                "no `deb` entry for {SUITE} main in /etc/apt/sources.list or /etc/apt/sources.list.d: \
                 add the Debian mirror this machine uses"
            )
        })?;
    let options = entry
        .signed_by
        .as_ref()
        .map(|keyring| format!("[signed-by={keyring}] "))
        .unwrap_or_default();
    Ok(format!("deb-src {options}{} {SUITE} main\n", entry.uri))
}

/// apt-get with a private sources list, lists and cache: the system's apt
/// configuration and state are not touched.
fn private_apt(layout: &Layout) -> Command {
    let mut cmd = Command::new("apt-get");
    let options = [
        format!(
            "Dir::Etc::SourceList={}",
            layout.apt.join("sources.list").display()
        ),
        "Dir::Etc::SourceParts=/nonexistent".to_string(),
        format!("Dir::State::Lists={}", layout.apt.join("lists").display()),
        format!("Dir::Cache={}", layout.apt.join("cache").display()),
        // Files in root-owned private folders: apt's _apt user could not
        // write there, and the fall-back only warns.
        "APT::Sandbox::User=root".to_string(),
    ];
    for option in options {
        cmd.args(["-o", &option]);
    }
    cmd
}

/// Downloads the source package and unpacks its `.orig` tarball into
/// `src/`, patched; `src/` appears only once all of that worked.
pub(super) fn source(layout: &Layout) -> anyhow::Result<()> {
    if layout.src.join("go.mod").exists() {
        return Ok(());
    }
    heading(&format!(
        "Kubernetes source: Debian {SUITE} {SOURCE_PACKAGE} {SOURCE_VERSION}"
    ));
    let line = source_list_line(&system_apt_entries()?)?;
    for dir in [
        layout.apt.join("lists/partial"),
        layout.apt.join("cache/archives/partial"),
        layout.download.clone(),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let list = layout.apt.join("sources.list");
    fs::write(&list, &line).with_context(|| format!("cannot write {}", list.display()))?;
    println!("{}: {}", list.display(), line.trim());
    run_cmd(private_apt(layout).args(["update", "-qq"]))
        .context("cannot fetch the mirror's source index (apt-get update with the private list)")?;
    run_cmd(
        private_apt(layout)
            .current_dir(&layout.download)
            .args(["source", "--download-only"])
            .arg(format!("{SOURCE_PACKAGE}={SOURCE_VERSION}")),
    )
    .with_context(|| {
        format!(
            "cannot download the source package {SOURCE_PACKAGE} {SOURCE_VERSION}: \
             if the mirror no longer has it, see `apt-cache showsrc {SOURCE_PACKAGE}` with the list in {}",
            list.display()
        )
    })?;
    let tarball = fs::read_dir(&layout.download)
        .with_context(|| format!("cannot read {}", layout.download.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(ORIG_TARBALL_PREFIX))
        })
        .with_context(|| {
            format!(
                "apt-get source left no {ORIG_TARBALL_PREFIX}* in {}",
                layout.download.display()
            )
        })?;

    // Unpack next to src/ and rename: an interrupted unpack is redone, never
    // mistaken for a tree.
    let partial = layout.root.join("src.partial");
    if partial.exists() {
        fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove {}", partial.display()))?;
    }
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    run_cmd(
        Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&partial)
            .args(["--strip-components=1", "--no-same-owner"]),
    )
    .with_context(|| format!("cannot unpack {}", tarball.display()))?;
    for needed in [
        "go.mod",
        "vendor/modules.txt",
        "cmd/kube-apiserver",
        "test/e2e",
        "Makefile",
    ] {
        if !partial.join(needed).exists() {
            bail!(
                "{} has no {needed}: this source package does not carry the full Kubernetes tree",
                tarball.display()
            );
        }
    }
    patch_networking(&partial)?;
    fs::rename(&partial, &layout.src).with_context(|| {
        format!(
            "cannot rename {} to {}",
            partial.display(),
            layout.src.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mirror_in_either_format() {
        let deb822 = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
            URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
            Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
            Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\
            Components: main\n";
        let entries = parse_deb822(deb822);
        assert_eq!(
            source_list_line(&entries).unwrap(),
            "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian bookworm main\n"
        );
        let one_line = "# comment\ndeb-src http://a/debian bookworm main\n\
            deb http://b/debian bookworm-backports main\n\
            deb [arch=amd64 signed-by=/k.gpg] http://c/debian bookworm main contrib\n";
        assert_eq!(
            source_list_line(&parse_one_line(one_line)).unwrap(),
            "deb-src [signed-by=/k.gpg] http://c/debian bookworm main\n"
        );
        assert!(source_list_line(&parse_one_line("deb http://b/debian trixie main\n")).is_err());
        let disabled =
            "Enabled: no\nTypes: deb\nURIs: http://x/debian\nSuites: bookworm\nComponents: main\n";
        assert!(parse_deb822(disabled).is_empty());
    }
}

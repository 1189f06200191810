//! The e2e suite's internet check: the patch that removes the networking
//! tests' HTTP GET to google.com, and the check that a tree carries it.

use std::fs;
use std::path::Path;

use anyhow::{Context, bail};

/// The file and the block in it that reach the internet.
const NETWORKING_GO: &str = "test/e2e/network/networking.go";
const INTERNET_GET: &str = "http.Get(\"http://google.com\")";
const INTERNET_HOST: &str = "google.com";
const PATCH_MARKER: &str = "flatnet: removed";

// --- The e2e suite's internet check -------------------------------------------

/// e2e 1.20's `[sig-network] Networking` runs `http.Get("http://google.com")`
/// in a BeforeEach of every test it holds; the suite must never reach the
/// internet, so that block goes.
pub(super) fn patch_networking(tree: &Path) -> anyhow::Result<()> {
    let path = tree.join(NETWORKING_GO);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let patched = remove_internet_check(&text).with_context(|| {
        format!(
            "cannot patch {}: look at it and adjust the patch",
            path.display()
        )
    })?;
    fs::write(&path, patched).with_context(|| format!("cannot write {}", path.display()))?;
    println!("e2e-build: removed the internet check from {NETWORKING_GO}");
    Ok(())
}

pub(super) fn verify_patched(tree: &Path) -> anyhow::Result<()> {
    let path = tree.join(NETWORKING_GO);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    if text.contains(INTERNET_HOST) || !text.contains(PATCH_MARKER) {
        bail!(
            "{} is not patched (it still names {INTERNET_HOST} or lacks the patch's comment): \
             remove {} to unpack and patch it again",
            path.display(),
            tree.display()
        );
    }
    Ok(())
}

/// Removes the `ginkgo.BeforeEach(func() { ... })` that holds the internet
/// GET, found by its content and delimited by its braces, and the
/// `net/http` import when nothing else uses it (Go rejects unused imports).
fn remove_internet_check(text: &str) -> anyhow::Result<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let hit = lines
        .iter()
        .position(|line| line.contains(INTERNET_GET))
        .with_context(|| format!("no line calls {INTERNET_GET}"))?;
    let start = (0..=hit)
        .rev()
        .find(|&i| {
            lines[i]
                .trim_start()
                .starts_with("ginkgo.BeforeEach(func() {")
        })
        .with_context(|| {
            format!("no `ginkgo.BeforeEach(func() {{` above the line calling {INTERNET_GET}")
        })?;
    let end = block_end(&lines[start..])
        .map(|len| start + len)
        .context("the BeforeEach block's braces do not close")?;
    if end < hit || lines[end].trim() != "})" {
        bail!(
            "the BeforeEach at line {} does not end in `}})` after the line calling {INTERNET_GET}",
            start + 1
        );
    }
    let indent: String = lines[start]
        .chars()
        .take_while(|c| c.is_whitespace())
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in &lines[..start] {
        out.push_str(line);
    }
    out.push_str(&format!(
        "{indent}// {PATCH_MARKER} a BeforeEach that asserted internet access with an HTTP GET:\n\
         {indent}// the e2e suite must never reach the internet.\n"
    ));
    for line in &lines[end + 1..] {
        out.push_str(line);
    }
    if !uses_package(&out, "http") {
        let before = out.len();
        out = out
            .split_inclusive('\n')
            .filter(|line| line.trim() != "\"net/http\"")
            .collect();
        if out.len() == before {
            bail!("net/http is no longer used but its import line was not found");
        }
    }
    if out.contains(INTERNET_HOST) {
        bail!("{INTERNET_HOST} still appears after removing the block");
    }
    Ok(out)
}

/// Index (within `lines`) of the line where the braces opened on the first
/// line are all closed; strings, runes and comments are skipped.
fn block_end(lines: &[&str]) -> Option<usize> {
    let mut depth = 0i32;
    let mut opened = false;
    let mut in_raw = false;
    for (index, line) in lines.iter().enumerate() {
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if in_raw {
                in_raw = c != '`';
                continue;
            }
            match c {
                '`' => in_raw = true,
                '"' | '\'' => {
                    while let Some(d) = chars.next() {
                        if d == '\\' {
                            chars.next();
                        } else if d == c {
                            break;
                        }
                    }
                }
                '/' if chars.clone().next() == Some('/') => break,
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if opened && depth == 0 {
            return Some(index);
        }
    }
    None
}

/// True when `package.` appears as a qualified identifier outside comments.
fn uses_package(text: &str, package: &str) -> bool {
    let needle = format!("{package}.");
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .any(|code| {
            code.match_indices(&needle).any(|(at, _)| {
                !code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NETWORKING: &str = r#"package network

import (
	"context"
	"net/http"
	"strconv"
)

var _ = SIGDescribe("Networking", func() {
	f := framework.NewDefaultFramework(svcname)

	ginkgo.BeforeEach(func() {
		// Assert basic external connectivity.
		ginkgo.By("Executing a successful http request from the external internet")
		resp, err := http.Get("http://google.com")
		if err != nil {
			framework.Failf("Unable to connect/talk to the internet: %v", err)
		}
		if resp.StatusCode != http.StatusOK {
			framework.Failf("Unexpected error code, expected 200, got, %v (%v)", resp.StatusCode, resp)
		}
	})

	ginkgo.It("should provide Internet connection", func() {
		checkConnectivityToHost(f, "", "connectivity-test", "8.8.8.8", 53, 30)
	})
})
"#;

    #[test]
    fn removes_the_block_and_the_unused_import() {
        let out = remove_internet_check(NETWORKING).unwrap();
        assert!(!out.contains("google.com"));
        assert!(!out.contains("\"net/http\""));
        assert!(!out.contains("ginkgo.BeforeEach"));
        assert!(out.contains(PATCH_MARKER));
        assert!(out.contains("\"strconv\""));
        assert!(out.contains("ginkgo.It(\"should provide Internet connection\""));
        assert!(out.contains("\tf := framework.NewDefaultFramework(svcname)\n"));
    }

    #[test]
    fn keeps_the_import_when_still_used() {
        let text = NETWORKING.replace("\tginkgo.It(", "\tvar _ = http.StatusOK\n\n\tginkgo.It(");
        let out = remove_internet_check(&text).unwrap();
        assert!(out.contains("\"net/http\""));
        assert!(!out.contains("google.com"));
    }

    #[test]
    fn fails_loudly_without_the_block() {
        let text = NETWORKING.replace("http.Get(\"http://google.com\")", "http.Get(url)");
        assert!(remove_internet_check(&text).is_err());
        let text = NETWORKING.replace(
            "ginkgo.BeforeEach(func() {",
            "ginkgo.JustBeforeEach(func() {",
        );
        assert!(remove_internet_check(&text).is_err());
    }

    #[test]
    fn braces_in_strings_do_not_count() {
        let lines = ["x(func() {\n", "  s := \"}\" + `}` + '}' // }\n", "})\n"];
        assert_eq!(block_end(&lines), Some(2));
    }

    #[test]
    fn package_use_is_a_whole_identifier() {
        assert!(uses_package("x := http.Get(u)", "http"));
        assert!(!uses_package("x := nethttp.Get(u)", "http"));
        assert!(!uses_package("// http.Get", "http"));
        assert!(!uses_package("import \"net/http\"", "http"));
    }
}

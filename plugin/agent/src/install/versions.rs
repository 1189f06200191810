//! Which CNI versions the conflist may offer: a runtime with libcni 1.2 or
//! later (containerd 2) picks the newest of `cniVersions` and, at 1.1.0,
//! asks every plugin of the list for STATUS before it calls the node's
//! network ready. A chained reference plugin that stops at 1.0.0 (Debian
//! bookworm's 1.1.1) fails that STATUS ("missing containerID"), and the
//! node never turns Ready. So 1.1.0 is offered only when every chained
//! plugin says it speaks it (the VERSION command); flatnet itself does.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// The CNI versions `plugin` says it supports (CNI_COMMAND=VERSION); None
/// when it cannot be run or says nothing readable.
pub fn supported_versions(plugin: &Path) -> Option<Vec<String>> {
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(br#"{"cniVersion":"1.0.0"}"#);
    }
    let output = child.wait_with_output().ok()?;
    let said: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    Some(
        said["supportedVersions"]
            .as_array()?
            .iter()
            .filter_map(|version| version.as_str().map(str::to_string))
            .collect(),
    )
}

/// The versions the conflist lists in `cniVersions`, given what each
/// chained plugin said (None: it could not be asked, so it is taken to
/// stop at 1.0.0, which every reference plugin since 1.0 speaks).
pub fn conflist_versions(chained: &[Option<Vec<String>>]) -> Vec<&'static str> {
    let all_speak_1_1 = chained.iter().all(|said| {
        said.as_ref()
            .is_some_and(|versions| versions.iter().any(|v| v == "1.1.0"))
    });
    if all_speak_1_1 {
        vec!["1.0.0", "1.1.0"]
    } else {
        vec!["1.0.0"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(versions: &[&str]) -> Option<Vec<String>> {
        Some(versions.iter().map(|v| v.to_string()).collect())
    }

    #[test]
    fn one_plugin_that_stops_at_1_0_keeps_the_list_at_1_0() {
        let bookworm = said(&["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]);
        let current = said(&["0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
        assert_eq!(conflist_versions(&[]), ["1.0.0", "1.1.0"]);
        assert_eq!(
            conflist_versions(&[current.clone(), current.clone()]),
            ["1.0.0", "1.1.0"]
        );
        assert_eq!(conflist_versions(&[current.clone(), bookworm]), ["1.0.0"]);
        assert_eq!(conflist_versions(&[current, None]), ["1.0.0"]);
    }

    #[test]
    fn a_plugin_that_cannot_run_says_nothing() {
        assert_eq!(supported_versions(Path::new("/nonexistent/portmap")), None);
    }
}

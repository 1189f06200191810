//! CNI spec versions: which ones flatnet speaks and how they differ.

use serde::Serialize;

use super::env::Command;
use super::error::{Error, Result};

/// Every spec version flatnet accepts, oldest first.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest supported version: used for errors before a config was read.
pub const LATEST: &str = "1.1.0";

/// A supported spec version, ordered oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpecVersion(usize);

impl SpecVersion {
    pub fn parse(raw: &str) -> Result<Self> {
        if raw.is_empty() {
            return Err(Error::IncompatibleVersion {
                requested: raw.into(),
                supported: SUPPORTED.join(", "),
            });
        }
        SUPPORTED
            .iter()
            .position(|v| *v == raw)
            .map(SpecVersion)
            .ok_or_else(|| Error::IncompatibleVersion {
                requested: raw.into(),
                supported: SUPPORTED.join(", "),
            })
    }

    pub fn as_str(self) -> &'static str {
        SUPPORTED[self.0]
    }

    /// 0.3.x/0.4.0 results carry `version` on every IP; 1.x dropped it.
    pub fn ips_carry_version(self) -> bool {
        self < Self::V1_0_0
    }

    /// CHECK appeared in 0.4.0.
    pub fn has_check(self) -> bool {
        self >= Self::V0_4_0
    }

    /// STATUS and GC appeared in 1.1.0.
    pub fn has_status_and_gc(self) -> bool {
        self >= Self::V1_1_0
    }

    /// Refuses (code 1) a verb this version does not have: CHECK before
    /// 0.4.0, STATUS and GC before 1.1.0. Both plugins answer alike.
    pub fn require_verb(self, command: Command) -> Result<()> {
        let since = match command {
            Command::Check if !self.has_check() => Self::V0_4_0,
            Command::Status | Command::Gc if !self.has_status_and_gc() => Self::V1_1_0,
            _ => return Ok(()),
        };
        Err(Error::IncompatibleVersion {
            requested: self.as_str().to_string(),
            supported: format!(
                "{} only from cniVersion {} on ({})",
                command.as_str(),
                since.as_str(),
                SUPPORTED[since.0..].join(", ")
            ),
        })
    }

    pub const V0_4_0: SpecVersion = SpecVersion(2);
    pub const V1_0_0: SpecVersion = SpecVersion(3);
    pub const V1_1_0: SpecVersion = SpecVersion(4);
}

/// The VERSION verb's answer.
#[derive(Debug, Serialize)]
pub struct VersionInfo {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<&'static str>,
}

/// Answers VERSION in the version the runtime asked for (stdin may be empty).
pub fn version_info(stdin: &[u8]) -> Result<VersionInfo> {
    let requested = if stdin.iter().all(u8::is_ascii_whitespace) {
        LATEST.to_string()
    } else {
        #[derive(serde::Deserialize)]
        struct Probe {
            #[serde(rename = "cniVersion", default)]
            cni_version: String,
        }
        let probe: Probe =
            serde_json::from_slice(stdin).map_err(|e| Error::decode("VERSION input", e))?;
        if probe.cni_version.is_empty() {
            LATEST.to_string()
        } else {
            probe.cni_version
        }
    };
    // An unknown requested version still gets the list, answered in the newest one.
    let cni_version = SpecVersion::parse(&requested).map_or(LATEST, SpecVersion::as_str);
    Ok(VersionInfo {
        cni_version: cni_version.into(),
        supported_versions: SUPPORTED.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_gated_by_the_version_that_introduced_them() {
        let v = |raw| SpecVersion::parse(raw).unwrap();
        let err = v("0.3.1").require_verb(Command::Check).unwrap_err();
        assert_eq!(err.code(), 1);
        assert!(
            err.to_string()
                .contains("CHECK only from cniVersion 0.4.0 on (0.4.0, 1.0.0, 1.1.0)"),
            "{err}"
        );
        assert!(v("0.4.0").require_verb(Command::Check).is_ok());
        for verb in [Command::Status, Command::Gc] {
            assert_eq!(v("1.0.0").require_verb(verb).unwrap_err().code(), 1);
            assert!(v("1.1.0").require_verb(verb).is_ok());
        }
        assert!(v("0.3.0").require_verb(Command::Add).is_ok());
        assert!(v("0.3.0").require_verb(Command::Del).is_ok());
    }

    #[test]
    fn known_versions_parse_in_order() {
        let parsed: Vec<_> = SUPPORTED
            .iter()
            .map(|v| SpecVersion::parse(v).unwrap())
            .collect();
        assert!(parsed.windows(2).all(|w| w[0] < w[1]));
        assert!(SpecVersion::parse("0.3.1").unwrap().ips_carry_version());
        assert!(!SpecVersion::parse("1.0.0").unwrap().ips_carry_version());
        assert!(!SpecVersion::parse("0.3.1").unwrap().has_check());
    }

    #[test]
    fn unknown_versions_get_code_1_and_the_list() {
        for bad in ["", "2.0.0", "1.0", "banana", "0.2.0"] {
            let err = SpecVersion::parse(bad).unwrap_err();
            assert_eq!(err.code(), 1);
            assert!(err.to_string().contains("1.1.0"), "{err}");
        }
    }

    #[test]
    fn version_verb_lists_everything() {
        let info = version_info(br#"{"cniVersion":"0.4.0"}"#).unwrap();
        assert_eq!(info.cni_version, "0.4.0");
        assert_eq!(info.supported_versions.len(), 5);
        assert_eq!(version_info(b"").unwrap().cni_version, LATEST);
        assert_eq!(version_info(b"{nope").unwrap_err().code(), 6);
    }
}

//! The CNI_* environment variables, parsed and validated.

use std::path::PathBuf;

use super::error::{Error, Result};

/// The verb the runtime asks for (CNI_COMMAND).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(raw: &str) -> Result<Self> {
        Ok(match raw {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "" => {
                return Err(Error::invalid_env(
                    "CNI_COMMAND",
                    "is missing or empty; a runtime sets it to ADD, DEL, CHECK, STATUS, GC or VERSION",
                ));
            }
            other => {
                return Err(Error::invalid_env(
                    "CNI_COMMAND",
                    format!(
                        "unknown command {other:?}; expected ADD, DEL, CHECK, STATUS, GC or VERSION"
                    ),
                ));
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// Everything the runtime passed through the environment.
#[derive(Debug, Clone, Default)]
pub struct CniEnv {
    pub container_id: String,
    /// Empty when the runtime gave none (allowed for DEL, STATUS, GC).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    /// CNI_ARGS as key/value pairs, in order.
    pub args: Vec<(String, String)>,
    pub path: Vec<PathBuf>,
}

impl CniEnv {
    /// Reads the variables `command` needs through `lookup` (normally `std::env::var`).
    pub fn from_lookup(command: Command, lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &'static str| lookup(name).filter(|value| !value.is_empty());
        let require = |name: &'static str| {
            get(name).ok_or_else(|| Error::invalid_env(name, "is missing or empty"))
        };
        let attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let mut env = CniEnv::default();
        if attachment {
            env.container_id = require("CNI_CONTAINERID")?;
            validate_container_id(&env.container_id)?;
            env.ifname = require("CNI_IFNAME")?;
            validate_ifname(&env.ifname)
                .map_err(|reason| Error::invalid_env("CNI_IFNAME", reason))?;
        }
        env.netns = match command {
            Command::Add | Command::Check => Some(PathBuf::from(require("CNI_NETNS")?)),
            _ => get("CNI_NETNS").map(PathBuf::from),
        };
        if matches!(
            command,
            Command::Add | Command::Del | Command::Check | Command::Status | Command::Gc
        ) {
            env.path = std::env::split_paths(&require("CNI_PATH")?).collect();
        }
        if let Some(raw) = get("CNI_ARGS") {
            env.args = if matches!(command, Command::Add | Command::Check) {
                parse_cni_args(&raw)?
            } else {
                // Only ADD and CHECK act on CNI_ARGS; DEL must clean up
                // whatever else the runtime sends along.
                cni_arg_entries(&raw).filter_map(Result::ok).collect()
            };
        }
        Ok(env)
    }

    pub fn from_process(command: Command) -> Result<Self> {
        Self::from_lookup(command, |name| std::env::var(name).ok())
    }

    /// The value of a CNI_ARGS key, if given.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// `FOO=BAR;ABC=123` into pairs; an entry without `=` is refused.
pub fn parse_cni_args(raw: &str) -> Result<Vec<(String, String)>> {
    cni_arg_entries(raw).collect()
}

/// The entries of CNI_ARGS, each a pair or the error naming it.
fn cni_arg_entries(raw: &str) -> impl Iterator<Item = Result<(String, String)>> + '_ {
    raw.split(';')
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .split_once('=')
                .filter(|(key, _)| !key.is_empty())
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .ok_or_else(|| {
                    Error::invalid_env("CNI_ARGS", format!("entry {entry:?} is not KEY=VALUE"))
                })
        })
}

/// Spec: starts with an alphanumeric, then alphanumerics, `_`, `.` or `-`.
pub fn validate_container_id(id: &str) -> Result<()> {
    if is_spec_name(id) {
        Ok(())
    } else {
        Err(Error::invalid_env(
            "CNI_CONTAINERID",
            format!(
                "{id:?} must start with a letter or digit and contain only letters, digits, '_', '.' or '-'"
            ),
        ))
    }
}

/// The spec's grammar for container IDs and network names.
pub fn is_spec_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A Linux interface name: 1..=15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("interface name is empty".into());
    }
    if name.len() > 15 {
        return Err(format!(
            "interface name {name:?} is {} bytes; at most 15 allowed",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("interface name {name:?} is not allowed"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "interface name {name:?} contains {bad:?}; use letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc-123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web"),
    ];

    #[test]
    fn parses_a_complete_add_environment() {
        let env = CniEnv::from_lookup(Command::Add, env_of(FULL)).unwrap();
        assert_eq!(env.container_id, "abc-123");
        assert_eq!(
            env.netns.as_deref(),
            Some(std::path::Path::new("/run/netns/x"))
        );
        assert_eq!(
            env.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        assert_eq!(env.arg("K8S_POD_NAME"), Some("web"));
    }

    #[test]
    fn each_missing_variable_is_named() {
        for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
            let pairs: Vec<_> = FULL
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let err = CniEnv::from_lookup(Command::Add, env_of(&pairs)).unwrap_err();
            assert_eq!(err.code(), 4);
            assert!(err.to_string().contains(missing), "{err}");
        }
    }

    #[test]
    fn del_without_netns_is_fine() {
        let pairs: Vec<_> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect();
        let env = CniEnv::from_lookup(Command::Del, env_of(&pairs)).unwrap();
        assert!(env.netns.is_none());
    }

    #[test]
    fn version_needs_nothing() {
        assert!(CniEnv::from_lookup(Command::Version, env_of(&[])).is_ok());
    }

    #[test]
    fn commands_parse_and_unknown_ones_are_refused() {
        assert_eq!(Command::parse("ADD").unwrap(), Command::Add);
        assert_eq!(Command::parse("GC").unwrap(), Command::Gc);
        assert_eq!(Command::parse("add").unwrap_err().code(), 4);
        assert_eq!(Command::parse("").unwrap_err().code(), 4);
    }

    #[test]
    fn container_ids_follow_the_spec_grammar() {
        for good in ["a", "0abc", "a_b.c-d", "4f8e1c2b9d"] {
            assert!(validate_container_id(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "_a", "a b", "a/b", "a;b", "é"] {
            assert_eq!(validate_container_id(bad).unwrap_err().code(), 4, "{bad}");
        }
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("a23456789012345").is_ok());
        for bad in ["", "a234567890123456", "a/b", "a b", "a:b", ".", ".."] {
            assert!(validate_ifname(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cni_args_need_key_value_pairs() {
        assert_eq!(
            parse_cni_args("A=1;B=").unwrap(),
            vec![("A".into(), "1".into()), ("B".into(), "".into())]
        );
        assert_eq!(parse_cni_args("A=1;junk").unwrap_err().code(), 4);
        let lookup = |name: &str| {
            Some(match name {
                "CNI_ARGS" => "A=1;junk".to_string(),
                "CNI_CONTAINERID" => "c1".to_string(),
                "CNI_IFNAME" => "eth0".to_string(),
                "CNI_NETNS" => "/proc/self/ns/net".to_string(),
                _ => "/opt/cni/bin".to_string(),
            })
        };
        // ADD refuses what it cannot read; DEL keeps the good entries and goes on.
        assert_eq!(
            CniEnv::from_lookup(Command::Add, lookup)
                .unwrap_err()
                .code(),
            4
        );
        let env = CniEnv::from_lookup(Command::Del, lookup).unwrap();
        assert_eq!(env.args, vec![("A".to_string(), "1".to_string())]);
        assert_eq!(parse_cni_args("=x").unwrap_err().code(), 4);
    }
}

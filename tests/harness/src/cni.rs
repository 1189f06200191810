//! Calling a CNI plugin the way a runtime does: the CNI variables in the
//! environment, the configuration on stdin, a JSON answer and an exit
//! status back.

use std::ffi::OsString;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// Debian's reference plugins (host-local, bridge, portmap, ...).
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// Where the workspace's built plugins are: `FLATNET_BIN_DIR` (xtask sets
/// it), else target/debug.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("FLATNET_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug"))
}

/// The CNI_PATH of [`CniCall::new`]: the built plugins first, then the
/// reference plugins.
pub fn cni_path() -> String {
    format!("{}:{REFERENCE_PLUGINS}", bin_dir().display())
}

/// What a plugin printed and how it exited.
#[derive(Debug)]
pub struct CniOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CniOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Asserts a CNI error object with `code` whose message contains `needle`.
    pub fn assert_error(&self, code: u64, needle: &str) {
        assert!(!self.success(), "expected failure, got {self:?}");
        let obj = self.json();
        assert_eq!(obj["code"], code, "{self:?}");
        let msg = obj["msg"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
        assert!(!self.stderr.is_empty(), "a human line belongs on stderr");
    }
}

impl From<std::process::Output> for CniOutput {
    fn from(out: std::process::Output) -> Self {
        CniOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// One plugin invocation, environment and all. Empty CNI variables are
/// left out of the environment.
#[derive(Debug, Clone, Default)]
pub struct CniCall {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// CNI_PATH.
    pub path: String,
    /// CNI_ARGS.
    pub args: String,
    /// The network namespace the runtime (the "node") runs in: the plugin
    /// enters it, and only it (the mount namespace, and the bpffs with it,
    /// stays). None: the caller's own.
    pub node: Option<PathBuf>,
    /// More environment for the plugin (`FLATNET_PIN_ROOT`, ...), set last.
    pub env: Vec<(String, OsString)>,
    /// The caller's environment passes on to the plugin, as libcni's does;
    /// otherwise the plugin sees PATH and the CNI variables only.
    pub inherit_env: bool,
}

impl CniCall {
    /// An invocation with [`cni_path`] as CNI_PATH.
    pub fn new(command: &str, container_id: &str, netns: &Path, ifname: &str) -> Self {
        CniCall {
            command: command.into(),
            container_id: container_id.into(),
            netns: netns.display().to_string(),
            ifname: ifname.into(),
            path: cni_path(),
            ..CniCall::default()
        }
    }

    /// The plugin's command, environment set, not yet started.
    pub fn to_command(&self, plugin: &Path) -> std::io::Result<Command> {
        let mut cmd = Command::new(plugin);
        if !self.inherit_env {
            cmd.env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        }
        for (key, value) in [
            ("CNI_COMMAND", &self.command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
            ("CNI_ARGS", &self.args),
        ] {
            if !value.is_empty() {
                cmd.env(key, value);
            }
        }
        cmd.envs(self.env.iter().map(|(key, value)| (key, value)));
        if let Some(node) = &self.node {
            crate::enter(&mut cmd, node)?;
        }
        Ok(cmd)
    }

    /// Starts the plugin with `stdin` written and closed; for callers that
    /// kill it or start many at once.
    pub fn try_spawn(&self, plugin: &Path, stdin: &[u8]) -> std::io::Result<Child> {
        let mut child = self
            .to_command(plugin)?
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // A configuration fits in the pipe buffer; a plugin killed early is fine.
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin);
        }
        Ok(child)
    }

    /// [`Self::try_spawn`] for a test: panics when the plugin cannot start.
    #[track_caller]
    pub fn spawn(&self, plugin: &Path, stdin: &[u8]) -> Child {
        self.try_spawn(plugin, stdin)
            .unwrap_or_else(|e| panic!("spawn {}: {e}", plugin.display()))
    }

    /// Runs the plugin with `stdin` and collects its answer.
    pub fn try_run(&self, plugin: &Path, stdin: &[u8]) -> std::io::Result<CniOutput> {
        collect(&mut self.to_command(plugin)?, stdin)
    }

    /// [`Self::try_run`] for a test: panics when the plugin cannot start.
    #[track_caller]
    pub fn run(&self, plugin: &Path, stdin: &[u8]) -> CniOutput {
        self.try_run(plugin, stdin)
            .unwrap_or_else(|e| panic!("run {}: {e}", plugin.display()))
    }
}

/// Runs a plugin command (env already set) with `stdin`, as a runtime
/// does, and collects what it answered; panics when it cannot start.
#[track_caller]
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8]) -> CniOutput {
    collect(cmd, stdin).unwrap_or_else(|e| panic!("run {:?}: {e}", cmd.get_program()))
}

fn collect(cmd: &mut Command, stdin: &[u8]) -> std::io::Result<CniOutput> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let input = child.stdin.take();
    let data = stdin.to_vec();
    // Written from a thread: a plugin may answer before reading it all (a
    // 10 MB stdin).
    let writer = std::thread::spawn(move || {
        if let Some(mut input) = input {
            let _ = input.write_all(&data);
        }
    });
    let out = child.wait_with_output();
    let _ = writer.join();
    Ok(CniOutput::from(out?))
}

/// The plugin binary `kind` as a runtime finds it: the first in CNI_PATH.
pub fn find_plugin(kind: &str, cni_path: &str) -> PathBuf {
    std::env::split_paths(cni_path)
        .map(|dir| dir.join(kind))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("plugin {kind} is not in CNI_PATH {cni_path}"))
}

/// The addresses of a CNI result (`ips[].address`), without their prefix
/// lengths, in order.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_call_sets_the_cni_variables_and_only_those() {
        let mut call = CniCall::new("ADD", "ctr", Path::new("/run/netns/x"), "eth0");
        call.env
            .push(("FLATNET_PIN_ROOT".into(), "/sys/fs/bpf/t".into()));
        let out = call.run(Path::new("/usr/bin/env"), b"");
        assert!(out.success(), "{out:?}");
        let mut lines: Vec<&str> = out.stdout.lines().collect();
        lines.sort();
        let path = format!("CNI_PATH={}", cni_path());
        assert_eq!(
            lines,
            [
                "CNI_COMMAND=ADD",
                "CNI_CONTAINERID=ctr",
                "CNI_IFNAME=eth0",
                "CNI_NETNS=/run/netns/x",
                &path,
                "FLATNET_PIN_ROOT=/sys/fs/bpf/t",
                &format!("PATH={}", std::env::var("PATH").unwrap_or_default()),
            ]
        );
    }

    #[test]
    fn stdin_reaches_the_plugin() {
        let call = CniCall::default();
        let out = call.run(Path::new("/bin/cat"), b"{\"cniVersion\":\"1.0.0\"}");
        assert_eq!(out.json(), json!({"cniVersion": "1.0.0"}));
        let child = call.spawn(Path::new("/bin/cat"), b"x");
        let out = CniOutput::from(child.wait_with_output().unwrap());
        assert_eq!((out.success(), out.stdout.as_str()), (true, "x"));
    }

    #[test]
    fn result_addresses_lose_their_prefix_length() {
        let result = json!({"ips": [{"address": "10.1.2.3/24"}, {"address": "fd00::3/64"}]});
        assert_eq!(
            result_ips(&result),
            [
                "10.1.2.3".parse::<IpAddr>().unwrap(),
                "fd00::3".parse().unwrap()
            ]
        );
        assert!(result_ips(&json!({})).is_empty());
    }
}

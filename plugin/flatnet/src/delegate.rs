//! Delegation to another plugin (the IPAM plugin), as the spec defines it:
//! find the binary in CNI_PATH, run it with our environment but the given
//! CNI_COMMAND, feed it the same network configuration, read its answer.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use flatnet_cni::env::Command;
use flatnet_cni::error::{Error, ErrorObject, Result};

/// A plugin binary found in CNI_PATH.
#[derive(Debug, Clone)]
pub struct Delegate {
    pub name: String,
    pub path: PathBuf,
}

impl Delegate {
    /// The first executable file called `name` in `search_path`.
    pub fn find(name: &str, search_path: &[PathBuf]) -> Result<Self> {
        search_path
            .iter()
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
            .map(|path| Delegate { name: name.to_string(), path })
            .ok_or_else(|| {
                let dirs: Vec<_> = search_path.iter().map(|d| d.display().to_string()).collect();
                Error::config(format!(
                    "IPAM plugin {name:?} was not found in CNI_PATH ({}): install it there or fix \"ipam.type\"",
                    dirs.join(":")
                ))
            })
    }

    /// Runs the plugin for `command`; returns its stdout parsed as JSON, if any.
    pub fn run(&self, command: Command, stdin: &[u8]) -> Result<Option<serde_json::Value>> {
        self.start(command, stdin)?.wait()
    }

    /// Starts the plugin for `command` and hands it its stdin; the caller
    /// does other work while it runs, then `wait`s for the answer.
    pub fn start(&self, command: Command, stdin: &[u8]) -> Result<Running> {
        let spawn = || {
            Process::new(&self.path)
                .env("CNI_COMMAND", command.as_str())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        };
        // "Text file busy": the binary is still open for writing somewhere
        // (an installer's copy, or its fd inherited by a process forked in
        // that instant). libcni retries this too; it passes at once.
        let mut tries = 0;
        let mut child = loop {
            match spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < TEXT_BUSY_TRIES => {
                    tries += 1;
                    std::thread::sleep(TEXT_BUSY_WAIT);
                }
                other => break other,
            }
        }
        .map_err(|e| {
            Error::Delegate(format!(
                "cannot run IPAM plugin {}: {e}",
                self.path.display()
            ))
        })?;
        if let Some(mut input) = child.stdin.take() {
            // A configuration fits in the pipe; dropping `input` closes it.
            // A plugin that exits without reading it is judged by its exit status.
            let _ = input.write_all(stdin);
        }
        Ok(Running {
            child,
            name: self.name.clone(),
            path: self.path.clone(),
        })
    }
}

/// How often, and how far apart, a plugin that is "text file busy" is
/// started again (2 s in all).
const TEXT_BUSY_TRIES: u32 = 40;
const TEXT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A delegated plugin that is running.
pub struct Running {
    child: std::process::Child,
    name: String,
    path: PathBuf,
}

impl Running {
    /// Its answer: stdout parsed as JSON (None when empty), or its error object.
    pub fn wait(self) -> Result<Option<serde_json::Value>> {
        let output = self.child.wait_with_output().map_err(|e| {
            Error::Delegate(format!(
                "waiting for IPAM plugin {}: {e}",
                self.path.display()
            ))
        })?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if output.status.success() {
            if stdout.trim().is_empty() {
                return Ok(None);
            }
            return serde_json::from_str(&stdout).map(Some).map_err(|e| {
                Error::Delegate(format!(
                    "IPAM plugin {} printed something that is not JSON: {e}",
                    self.name
                ))
            });
        }
        match serde_json::from_str::<ErrorObject>(&stdout) {
            Ok(object) => Err(Error::Delegated {
                plugin: format!("IPAM plugin {}", self.name),
                code: object.code,
                msg: object.msg,
                details: object.details,
            }),
            Err(_) => {
                let stderr = String::from_utf8_lossy(&output.stderr);
                Err(Error::Delegate(format!(
                    "IPAM plugin {} failed ({}) without an error object: {}",
                    self.name,
                    output.status,
                    stderr.trim()
                )))
            }
        }
    }
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str) {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flatnet-delegate-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn finds_the_first_executable_in_path() {
        let (a, b) = (tempdir("a"), tempdir("b"));
        std::fs::write(a.join("ipam"), "not executable").unwrap();
        script(&b, "ipam", "true");
        let found = Delegate::find("ipam", &[a.clone(), b.clone()]).unwrap();
        assert_eq!(found.path, b.join("ipam"));
        let err = Delegate::find("missing", &[a.clone(), b.clone()]).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("missing"));
        let _ = (std::fs::remove_dir_all(a), std::fs::remove_dir_all(b));
    }

    #[test]
    fn passes_the_command_and_stdin_and_reads_json() {
        let dir = tempdir("run");
        script(
            &dir,
            "echoer",
            r#"read -r line; printf '{"cmd":"%s","in":%s}' "$CNI_COMMAND" "$line""#,
        );
        let delegate = Delegate::find("echoer", std::slice::from_ref(&dir)).unwrap();
        let out = delegate.run(Command::Add, b"{\"a\":1}\n").unwrap().unwrap();
        assert_eq!(out["cmd"], "ADD");
        assert_eq!(out["in"]["a"], 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_plugin_still_open_for_writing_is_started_once_it_is_closed() {
        let dir = tempdir("busy");
        script(&dir, "busy", r#"printf '{"ok":true}'"#);
        // A writer holds the binary open (ETXTBSY for exec) for a while.
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("busy"))
            .unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(writer);
        });
        let delegate = Delegate::find("busy", std::slice::from_ref(&dir)).unwrap();
        let out = delegate.run(Command::Add, b"{}\n").unwrap().unwrap();
        assert_eq!(out["ok"], true);
        closer.join().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn error_objects_keep_their_code() {
        let dir = tempdir("err");
        script(
            &dir,
            "failer",
            r#"echo '{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"later"}'; exit 1"#,
        );
        script(&dir, "crasher", "echo boom >&2; exit 3");
        let err = Delegate::find("failer", std::slice::from_ref(&dir))
            .unwrap()
            .run(Command::Add, b"{}")
            .unwrap_err();
        assert_eq!(err.code(), 11);
        assert!(err.to_string().contains("busy"));
        let err = Delegate::find("crasher", std::slice::from_ref(&dir))
            .unwrap()
            .run(Command::Add, b"{}")
            .unwrap_err();
        assert_eq!(err.code(), 103);
        assert!(err.to_string().contains("boom"));
        let _ = std::fs::remove_dir_all(dir);
    }
}

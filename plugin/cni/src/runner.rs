//! Runs one CNI invocation: reads env and stdin, calls the binary's dispatch
//! function, prints the result or the error object on stdout (a human line on
//! stderr), and turns the outcome into the exit status.
//!
//! Shared by `flatnet` and `flatnet-ipam`: each binary only brings a
//! [`Plugin`] whose dispatch parses its own configuration and runs the verb.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::config::MAX_CONFIG_BYTES;
use crate::env::{CniEnv, Command};
use crate::error::{Error, Result};
use crate::version::{self, LATEST};

/// What a verb prints on success.
pub enum Output {
    Json(serde_json::Value),
    Nothing,
}

/// What the runner needs to know about the configuration to report an
/// outcome; a dispatch function fills it in as soon as it has parsed stdin.
pub struct Report {
    /// The version error objects are written in: the config's once known.
    pub cni_version: String,
    pub log_file: Option<PathBuf>,
    /// What the verb left for after its answer (slow kernel work nobody
    /// needs to wait for), run once the answer is on stdout, whether the
    /// verb succeeded or not.
    pub after_answer: Option<Box<dyn FnOnce()>>,
}

/// A verb handler: everything after VERSION, env parsing included.
pub type Dispatch = fn(Command, &CniEnv, &[u8], &mut Report) -> Result<Output>;

/// One plugin binary.
pub struct Plugin {
    /// Prefix of the human line on stderr.
    pub name: &'static str,
    /// Put in front of each `logFile` line, so plugins sharing a file are told apart.
    pub log_tag: &'static str,
    pub dispatch: Dispatch,
}

/// Runs `plugin` for the CNI_COMMAND of this process.
pub fn run(plugin: &Plugin) -> ExitCode {
    let started = Instant::now();
    let mut report = Report {
        cni_version: LATEST.to_string(),
        log_file: None,
        after_answer: None,
    };
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let outcome = read_stdin().and_then(|stdin| {
        let command = Command::parse(&command)?;
        if command == Command::Version {
            let info = version::version_info(&stdin)?;
            return Ok(Output::Json(serde_json::to_value(info).unwrap_or_default()));
        }
        let env = CniEnv::from_process(command)?;
        (plugin.dispatch)(command, &env, &stdin, &mut report)
    });
    let elapsed = started.elapsed();
    let mut stdout = std::io::stdout().lock();
    let status = match outcome {
        Ok(output) => {
            if let Output::Json(json) = output {
                let _ = writeln!(stdout, "{json}");
            }
            log(
                report.log_file.as_deref(),
                &format!(
                    "{}{command} ok in {:.1} ms",
                    plugin.log_tag,
                    elapsed.as_secs_f64() * 1e3
                ),
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            let object = err.to_object(&report.cni_version);
            let _ = writeln!(
                stdout,
                "{}",
                serde_json::to_string(&object).unwrap_or_default()
            );
            let line = format!("{command} failed: {err} (CNI error code {})", err.code());
            eprintln!("{}: {line}", plugin.name);
            log(
                report.log_file.as_deref(),
                &format!("{}{line}", plugin.log_tag),
            );
            ExitCode::FAILURE
        }
    };
    // The answer must be out before the work after it starts (which may
    // fork: a copy of an unflushed buffer would be printed twice).
    let _ = stdout.flush();
    drop(stdout);
    if let Some(work) = report.after_answer.take() {
        work();
    }
    status
}

/// Stdin, refusing anything larger than a configuration can be.
fn read_stdin() -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io("reading the network configuration from stdin", e))?;
    Ok(buf)
}

/// One line per invocation to `logFile`, when configured.
fn log(file: Option<&std::path::Path>, line: &str) {
    let Some(path) = file else { return };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let container = std::env::var("CNI_CONTAINERID").unwrap_or_default();
    let ifname = std::env::var("CNI_IFNAME").unwrap_or_default();
    if let Ok(mut out) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(
            out,
            "{now:.3} pid={} container={container} ifname={ifname} {line}",
            std::process::id()
        );
    }
}

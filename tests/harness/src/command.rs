//! Running a command and collecting what it printed.

use std::process::Command;

/// A command that could not be started or did not succeed.
#[derive(Debug)]
pub struct CommandError {
    /// The command line, as [`describe`] writes it.
    pub command: String,
    /// What went wrong: the spawn error, or the exit status and stderr.
    pub detail: String,
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` {}", self.command, self.detail)
    }
}

impl std::error::Error for CommandError {}

/// The command line: the program and its arguments, space-separated.
pub fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Runs a command and returns its stdout; an error (with its stderr) when
/// it cannot start or fails.
pub fn output(cmd: &mut Command) -> Result<String, CommandError> {
    let command = describe(cmd);
    let error = |detail: String| CommandError {
        command: command.clone(),
        detail,
    };
    let out = cmd
        .output()
        .map_err(|e| error(format!("cannot start: {e}")))?;
    if !out.status.success() {
        return Err(error(format!(
            "failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What `bpftool` printed, judged by what it printed rather than by its
/// exit status: bookworm-backports' bpftool 7.5.0 answers every `link show`
/// of a tcx link correctly and then exits 255. A non-zero exit is an
/// error only when there is no answer, or the answer is bpftool's error
/// (`Error: ...` on stderr; `{"error": ...}` on stdout with `-j`).
pub fn bpftool(cmd: &mut Command) -> Result<String, CommandError> {
    let command = describe(cmd);
    let out = cmd.output().map_err(|e| CommandError {
        command: command.clone(),
        detail: format!("cannot start: {e}"),
    })?;
    judge_bpftool(&command, &out)
}

fn judge_bpftool(command: &str, out: &std::process::Output) -> Result<String, CommandError> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let answered = !stdout.trim().is_empty()
        && !stdout.trim_start().starts_with("{\"error\"")
        && !stderr.contains("Error:");
    if out.status.success() || answered {
        return Ok(stdout);
    }
    Err(CommandError {
        command: command.to_string(),
        detail: format!(
            "failed with {}: {}{}",
            out.status,
            stderr.trim(),
            stdout.trim()
        ),
    })
}

/// [`output`] for a test: panics when the command fails.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> String {
    output(cmd).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_errors_name_the_command() {
        assert_eq!(
            output(Command::new("sh").args(["-c", "echo hi"])).unwrap(),
            "hi\n"
        );
        let failed = output(Command::new("sh").args(["-c", "echo oops >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(failed.starts_with("`sh -c echo oops >&2; exit 3` failed with exit status: 3"));
        assert!(failed.ends_with(": oops"), "{failed}");
        let missing = output(&mut Command::new("/nonexistent/flatnet")).unwrap_err();
        assert!(missing.detail.starts_with("cannot start"), "{missing}");
    }

    fn bpftool_said(status: i32, stdout: &str, stderr: &str) -> Result<String, CommandError> {
        use std::os::unix::process::ExitStatusExt;
        let out = std::process::Output {
            status: std::process::ExitStatus::from_raw(status << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        };
        judge_bpftool("bpftool link show", &out)
    }

    #[test]
    fn bpftool_is_judged_by_what_it_printed() {
        let tcx = "12: tcx  prog 34\n\tifindex veth0(7)  attach_type tcx_ingress\n";
        // 7.5.0 (bookworm-backports): a correct answer, then exit 255.
        assert_eq!(bpftool_said(255, tcx, "").unwrap(), tcx);
        assert_eq!(bpftool_said(0, tcx, "").unwrap(), tcx);
        // Its real errors stay errors, in both output styles.
        let plain = bpftool_said(
            255,
            "",
            "Error: bpf obj get (/sys/fs/bpf/x): No such file\n",
        );
        assert!(plain.unwrap_err().detail.contains("No such file"));
        let json = bpftool_said(
            255,
            "{\"error\":\"can't get link by id (9): No such file\"}",
            "",
        );
        assert!(json.unwrap_err().detail.contains("can't get link"));
        assert!(bpftool_said(255, "", "").is_err());
    }
}

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
}

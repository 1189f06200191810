//! Per-stage timers: with FLATNET_TRACE set, each invocation prints how long
//! every stage took on stderr (and they go nowhere otherwise).
//!
//! The stages double as crash points for tests: with FLATNET_KILL_AFTER set
//! to a stage's name, the process kills itself (SIGKILL, as the OOM killer
//! or a node reboot would) right after that stage; with FLATNET_STOP_AFTER,
//! it stops itself (SIGSTOP) there, so a test can kill what runs it first.

use std::sync::Mutex;
use std::time::Instant;

struct Stages {
    start: Instant,
    last: Instant,
    lines: Vec<String>,
}

static STAGES: Mutex<Option<Stages>> = Mutex::new(None);

/// Starts timing if FLATNET_TRACE is set.
pub fn start() {
    if std::env::var_os("FLATNET_TRACE").is_some()
        && let Ok(mut stages) = STAGES.lock()
    {
        let now = Instant::now();
        *stages = Some(Stages {
            start: now,
            last: now,
            lines: Vec::new(),
        });
    }
}

/// Records the time since the previous mark under `stage`.
pub fn mark(stage: &str) {
    if std::env::var_os("FLATNET_KILL_AFTER").is_some_and(|at| at == stage) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    if std::env::var_os("FLATNET_STOP_AFTER").is_some_and(|at| at == stage) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
    if let Ok(mut guard) = STAGES.lock()
        && let Some(stages) = guard.as_mut()
    {
        let now = Instant::now();
        let micros = (now - stages.last).as_micros();
        stages.lines.push(format!("{micros:>7} us  {stage}"));
        stages.last = now;
    }
}

/// Prints the stages and the total to stderr.
pub fn report(what: &str) {
    if let Ok(guard) = STAGES.lock()
        && let Some(stages) = guard.as_ref()
    {
        let mut out = format!("flatnet trace: {what}\n");
        for line in &stages.lines {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!(
            "{:>7} us  total\n",
            stages.start.elapsed().as_micros()
        ));
        eprint!("{out}");
    }
}

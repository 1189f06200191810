//! Deleting a network device costs ~20 ms in the kernel (an RCU barrier in
//! the unregister path, paid by the process that asks). DEL does what
//! disconnects the pod at once (endpoint out of the map, link down) and hands
//! the unregister to a detached child, so the runtime is not kept waiting.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};

use crate::cni::error::{Error, Result};
use crate::link::Netlink;

/// The hidden argument that turns `flatnet` into a reaper.
pub const REAP_ARG: &str = "__reap-link";

/// Starts a detached `flatnet __reap-link <index> <name>`: its own session,
/// no stdio, so neither the runtime's pipes nor its signals hold it.
pub fn spawn(index: u32, name: &str) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::io("locating the flatnet binary", e))?;
    let mut cmd = Command::new(exe);
    cmd.arg(REAP_ARG)
        .arg(index.to_string())
        .arg(name)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    // The child is not waited for: once we exit it is reparented and reaped.
    cmd.spawn()
        .map(drop)
        .map_err(|e| Error::io("starting the link reaper", e))
}

/// The reaper's main: deletes link `index` if it still carries `name`
/// (so a reused ifindex is never touched).
pub fn run(args: &[String]) -> ExitCode {
    let (Some(index), Some(name)) = (
        args.first().and_then(|i| i.parse::<u32>().ok()),
        args.get(1),
    ) else {
        eprintln!("usage: flatnet {REAP_ARG} <ifindex> <name>");
        return ExitCode::FAILURE;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    let outcome = runtime.block_on(async {
        let host = Netlink::connect()?;
        match host.link_by_index(index).await? {
            Some(link) if link.name == *name => host.delete_link(index).await,
            _ => Ok(()),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flatnet {REAP_ARG}: {e}");
            ExitCode::FAILURE
        }
    }
}

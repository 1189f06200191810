//! ADD's pod records (`flatnet_datapath::node::first_packet`), watched: each one
//! written or removed wakes the policy computation, so a new pod's policy
//! (and its address in its peers' tables) is written milliseconds after
//! its ADD rather than after kubelet reports its IP.

use std::path::Path;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::watch;

use crate::error::{AgentError, Result};

/// Watches `dir` (created when missing) from a thread of its own; the
/// receiver's value changes after every record written or removed.
pub fn spawn(dir: &Path) -> Result<watch::Receiver<u64>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| AgentError::io(format!("creating {}", dir.display()), e))?;
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)
        .map_err(|e| AgentError::io("inotify_init", e.into()))?;
    // Records arrive by rename and go by unlink; the folder itself goes
    // with the network's last pod (then nothing is left to watch).
    inotify
        .add_watch(
            dir,
            AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_CLOSE_WRITE,
        )
        .map_err(|e| AgentError::io(format!("watching {}", dir.display()), e.into()))?;
    let (changes, receiver) = watch::channel(0u64);
    std::thread::Builder::new()
        .name("pod-records".into())
        .spawn(move || {
            while let Ok(events) = inotify.read_events() {
                let records = events.iter().any(|event| {
                    event
                        .name
                        .as_ref()
                        .is_some_and(|name| !name.to_string_lossy().starts_with('.'))
                });
                if changes.is_closed() {
                    return;
                }
                if records {
                    changes.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
        })
        .map_err(|e| AgentError::io("starting the pod records watch", e))?;
    Ok(receiver)
}

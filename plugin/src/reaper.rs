//! Deleting a network device costs ~20 ms in the kernel (an RCU barrier in
//! the unregister path, paid by the process that asks). DEL does what
//! disconnects the pod at once (endpoint out of the map, link down) and
//! defers the unregister: once the answer is on stdout, `finish` forks a
//! child in its own session, with stdio on /dev/null, that deletes the
//! links while the parent exits and the runtime carries on.

use std::sync::Mutex;

use crate::net::Netlink;

/// Links (ifindex, name) to delete after the answer is out.
static PENDING: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

/// Deletes link `index` later, if it still carries `name` then (so a reused
/// ifindex is never touched).
pub fn defer(index: u32, name: &str) {
    if let Ok(mut pending) = PENDING.lock() {
        pending.push((index, name.to_string()));
    }
}

/// Call last in `main`, with stdout flushed and no async runtime alive: the
/// process must be single-threaded for `fork`.
pub fn finish() {
    let links = PENDING
        .lock()
        .map(|mut p| std::mem::take(&mut *p))
        .unwrap_or_default();
    if links.is_empty() {
        return;
    }
    // SAFETY: called from main after every runtime and thread is gone, so
    // the child is a copy of a single-threaded process.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Parent { .. }) => {}
        Ok(nix::unistd::ForkResult::Child) => {
            detach();
            delete(&links);
            std::process::exit(0);
        }
        // No fork: do it here and now, slower but complete.
        Err(_) => delete(&links),
    }
}

/// Own session (the runtime's signals to our group miss it) and stdio on
/// /dev/null (the runtime sees EOF on our stdout as soon as the parent exits).
fn detach() {
    let _ = nix::unistd::setsid();
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

fn delete(links: &[(u32, String)]) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let Ok(host) = Netlink::connect() else { return };
        for (index, name) in links {
            if let Ok(Some(link)) = host.link_by_index(*index).await
                && link.name == *name
                && let Err(e) = host.delete_link(*index).await
            {
                eprintln!("flatnet: deleting {name}: {e}");
            }
        }
    });
}

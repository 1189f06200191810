//! Work that waits on the kernel, done after the answer is out. Deleting a
//! network device costs ~20 ms (an RCU barrier in the unregister path,
//! paid by the process that asks): DEL does what disconnects the pod at
//! once (endpoint out of the map, link down) and defers the unregister.
//! Creating a tcx link waits for an RCU grace period (~10 ms) while holding
//! rtnl, the lock every netlink change of every device on the node takes:
//! ADD puts the program on the new veth as a cls_bpf filter (a netlink
//! request) and defers the move to a tcx link until the network has been
//! quiet (no ADD or DEL) for `QUIET`, so a burst of pod starts is not
//! serialised behind the moves; releasing a pinned tcx link of a live
//! device costs the same, so DEL's unpinning waits for the delete here.
//! A verb collects this work in an [`AfterAnswer`]; once the answer is on
//! stdout the runner calls [`AfterAnswer::run_detached`], which forks a
//! child in its own session, with stdio on /dev/null, that does it while
//! the parent exits and the runtime carries on. A move that
//! never happens (the child killed) leaves a working filter, which the
//! next re-attach of the network (upgrade, `flatnet repair`, the agent
//! after wiped pins) moves.

use std::time::{Duration, Instant};

use flatnet_datapath::bpf::{Datapath, move_to_tcx, move_xdp_mode_to_tcx};
use flatnet_datapath::lock::{self, Lock};
use flatnet_datapath::netlink::Netlink;

/// How long a network must have seen no ADD or DEL before a move starts,
/// and the longest a move waits for that.
const QUIET: Duration = Duration::from_millis(100);
const QUIET_WAIT_LIMIT: Duration = Duration::from_secs(5);

struct TcxMove {
    network: String,
    datapath: Datapath,
    index: u32,
    name: String,
    /// XDP mode: `from_pod_passed` and `to_pod` (`from_pod_xdp` has its
    /// XDP link already).
    xdp_mode: bool,
}

/// What a verb leaves for after its answer: the dispatch hands it to the
/// runner, which runs it once the answer is on stdout, whether the verb
/// succeeded or not (a failed ADD's rollback may retire a device too).
#[derive(Default)]
pub struct AfterAnswer {
    /// Links (ifindex, name) to delete.
    deletes: Vec<(u32, String)>,
    /// Host veths to move onto tcx links.
    tcx_moves: Vec<TcxMove>,
    /// Pod link pins (datapath, host veth name) to remove after the deletes.
    unpins: Vec<(Datapath, String)>,
}

impl AfterAnswer {
    /// Moves host veth `index` (named `name`) of `network` from its cls_bpf
    /// filter to a tcx link (see `bpf::move_to_tcx`).
    pub fn move_to_tcx(&mut self, network: &str, datapath: &Datapath, index: u32, name: &str) {
        self.tcx_moves.push(TcxMove {
            network: network.to_string(),
            datapath: datapath.clone(),
            index,
            name: name.to_string(),
            xdp_mode: false,
        });
    }

    /// Moves XDP mode's tc programs (`from_pod_passed`, `to_pod`) from
    /// their cls_bpf filters to tcx links (see `bpf::move_xdp_mode_to_tcx`).
    pub fn move_xdp_mode_to_tcx(
        &mut self,
        network: &str,
        datapath: &Datapath,
        index: u32,
        name: &str,
    ) {
        self.tcx_moves.push(TcxMove {
            network: network.to_string(),
            datapath: datapath.clone(),
            index,
            name: name.to_string(),
            xdp_mode: true,
        });
    }

    /// Removes the link pins of pod veth `host_veth` after the deletes.
    pub fn unpin(&mut self, datapath: &Datapath, host_veth: &str) {
        self.unpins.push((datapath.clone(), host_veth.to_string()));
    }

    /// Deletes link `index`, if it still carries `name` then (so a reused
    /// ifindex is never touched).
    pub fn delete_link(&mut self, index: u32, name: &str) {
        self.deletes.push((index, name.to_string()));
    }

    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.tcx_moves.is_empty() && self.unpins.is_empty()
    }

    /// Call with the answer flushed and no async runtime alive: the process
    /// must be single-threaded for `fork`.
    pub fn run_detached(self) {
        if self.is_empty() {
            return;
        }
        // SAFETY: the runner calls this after the verb's runtime and every
        // thread are gone, so the child is a copy of a single-threaded process.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Parent { .. }) => {}
            Ok(nix::unistd::ForkResult::Child) => {
                detach();
                self.run();
                std::process::exit(0);
            }
            // No fork: do it here and now, slower but complete.
            Err(_) => self.run(),
        }
    }

    fn run(&self) {
        run(&self.tcx_moves, &self.deletes, &self.unpins);
    }
}

fn run(moves: &[TcxMove], links: &[(u32, String)], unpins: &[(Datapath, String)]) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let Ok(host) = Netlink::connect() else { return };
        for job in moves {
            if let Err(e) = move_one(&host, job).await {
                eprintln!("flatnet: moving {} to tcx: {e}", job.name);
            }
        }
        delete(&host, links).await;
        for (datapath, host_veth) in unpins {
            if let Err(e) = datapath.unpin_pod_links(host_veth) {
                eprintln!("flatnet: unpinning the links of {host_veth}: {e}");
            }
        }
    });
}

/// Waits until `network` has seen no ADD or DEL for `QUIET` (at most
/// `QUIET_WAIT_LIMIT`, then the move goes ahead anyway).
async fn quiet(network: &str) {
    let started = Instant::now();
    while started.elapsed() < QUIET_WAIT_LIMIT {
        match lock::idle_for(&lock::network(network)) {
            Some(idle) if idle < QUIET => tokio::time::sleep(QUIET - idle).await,
            _ => return,
        }
    }
}

/// One move, under the network's shared lock (an upgrade, which holds it
/// exclusively, re-attaches every veth itself), and only while the veth is
/// still the one ADD made.
async fn move_one(host: &Netlink, job: &TcxMove) -> crate::error::Result<()> {
    quiet(&job.network).await;
    // A network removed meanwhile (its last DEL took the lock file away,
    // before or while this waited): nothing to move, and no lock file or
    // link pin to create again.
    let Some(_lock) = Lock::shared_if_present(&lock::network(&job.network))? else {
        return Ok(());
    };
    match host.link_by_index(job.index).await? {
        Some(link) if link.name == job.name && job.xdp_mode => {
            Ok(move_xdp_mode_to_tcx(&job.datapath, host, job.index, &job.name).await?)
        }
        Some(link) if link.name == job.name => {
            Ok(move_to_tcx(&job.datapath, host, job.index, &job.name).await?)
        }
        // Deleted (a DEL came first): nothing to move.
        _ => Ok(()),
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

async fn delete(host: &Netlink, links: &[(u32, String)]) {
    for (index, name) in links {
        if let Ok(Some(link)) = host.link_by_index(*index).await
            && link.name == *name
            && let Err(e) = host.delete_link(*index).await
        {
            eprintln!("flatnet: deleting {name}: {e}");
        }
    }
}

//! What follows a backend leaving a frontend, once the maps no longer lead
//! to it: the local clients' sockets that the socket programs sent to it
//! for that frontend are destroyed (their next call fails and they connect
//! again, to a live backend), and the uplink's UDP flows to it forgotten.
//! Both read the kernel at length (every network namespace's sockets, the
//! whole NAT table), so they run on a thread of their own: the agent's
//! loop goes on to the next change as soon as the maps are written.
//!
//! Departures are taken in order; those that gathered while a search ran
//! are searched together. A backend that is back in its frontend's
//! backends by then (a slice rewritten twice) is left alone.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use flatnet_datapath::bpf::{Datapath, backend_address, service_key};
use flatnet_datapath::sockets::{self, Connected};

use crate::metrics::AgentMetrics;
use crate::services::plan::FrontendKey;

/// (frontend, backend) pairs: the backend left the frontend.
pub type Departed = BTreeSet<(FrontendKey, SocketAddr)>;

/// Hands departures to the thread that acts on them.
pub struct Departures {
    to_worker: Sender<Departed>,
}

impl Departures {
    pub fn start(datapath: Datapath, metrics: AgentMetrics) -> Self {
        let (to_worker, from_sync) = channel();
        let worker = move || act_on_departures(&datapath, &metrics, &from_sync);
        if let Err(e) = std::thread::Builder::new()
            .name("departures".into())
            .spawn(worker)
        {
            // The sender's sends fail then: logged at each one.
            tracing::error!(error = %e, "cannot start the departures thread");
        }
        Departures { to_worker }
    }

    pub fn send(&self, departed: Departed) {
        if departed.is_empty() {
            return;
        }
        if self.to_worker.send(departed).is_err() {
            tracing::warn!("the departures thread is gone: sockets to departed backends stay");
        }
    }
}

fn act_on_departures(datapath: &Datapath, metrics: &AgentMetrics, from_sync: &Receiver<Departed>) {
    while let Ok(mut departed) = from_sync.recv() {
        while let Ok(more) = from_sync.try_recv() {
            departed.extend(more);
        }
        departed.retain(|(frontend, backend)| !back_again(datapath, *frontend, *backend));
        if departed.is_empty() {
            continue;
        }
        close_departed(datapath, metrics, &departed);
        crate::services::nat::forget_departed(datapath, metrics, &departed);
    }
}

/// Whether the maps lead `frontend` to `backend` again.
fn back_again(datapath: &Datapath, frontend: FrontendKey, backend: SocketAddr) -> bool {
    let key = service_key(frontend.0, frontend.1, frontend.2);
    match datapath.service_backends(&key) {
        Ok(Some(backends)) => backends.iter().any(|b| backend_address(b) == backend),
        _ => false,
    }
}

/// Destroys the local clients' sockets that the socket programs sent to a
/// backend in `departed` for its frontend there.
fn close_departed(datapath: &Datapath, metrics: &AgentMetrics, departed: &Departed) {
    let peers: BTreeSet<(u8, SocketAddr)> = departed
        .iter()
        .map(|((_, _, protocol), backend)| (*protocol, *backend))
        .collect();
    let condemn = |socket: &Connected| match datapath.socket_frontend(socket.cookie, socket.peer) {
        Ok(Some(frontend)) => departed.contains(&(
            (frontend.ip(), frontend.port(), socket.protocol),
            socket.peer,
        )),
        _ => false,
    };
    let searching = Instant::now();
    let outcome = sockets::destroy_connected(&peers, &condemn);
    tracing::info!(
        departed = departed.len(),
        namespaces = outcome.namespaces_searched,
        destroyed = outcome.sockets.len(),
        elapsed_ms = searching.elapsed().as_secs_f64() * 1e3,
        "searched for sockets to backends that left"
    );
    for socket in &outcome.sockets {
        // The LRU would age it out; a destroyed socket needs no record.
        let _ = datapath.forget_socket(socket.cookie, socket.peer);
        tracing::info!(
            protocol = socket.protocol,
            local = %socket.local,
            backend = %socket.peer,
            "destroyed a socket whose Service backend left"
        );
    }
    metrics
        .service_sockets_destroyed
        .inc_by(outcome.sockets.len() as u64);
    for failure in &outcome.failures {
        tracing::warn!(error = %failure, "cannot search a network namespace for sockets to destroy");
    }
}

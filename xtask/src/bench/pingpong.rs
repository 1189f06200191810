//! TCP round-trip latency: blocking sockets, TCP_NODELAY, 64-byte messages,
//! every round trip timed. Client and server threads enter their pods'
//! namespaces and share one CPU, so a round trip is the path under test and
//! not cross-CPU wake-ups.
//!
//! This VM switches, every few seconds, between a fast and a slow state
//! (the same bare veth: 6.2 or 9.8 µs per round trip). The paths are
//! therefore measured in short slices taken in turn, so that each triple
//! (bridge, flatnet, veth) sits in one state, and the medians over slices
//! compare like with like.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

const MESSAGE: usize = 64;
const WARMUP: usize = 2_000;

/// This thread into `netns`, on `cpu` (when the machine has it).
fn enter(netns: &Path, cpu: usize) -> anyhow::Result<()> {
    flatnet_harness::enter_thread(netns)
        .with_context(|| format!("entering {}", netns.display()))?;
    if std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        > cpu
    {
        let mut set = CpuSet::new();
        set.set(cpu)?;
        sched_setaffinity(Pid::from_raw(0), &set)?;
    }
    Ok(())
}

/// (p50, p99) round trip in µs between a client in `client_ns` and an echo
/// server bound to `bind` (port 0: any) in `server_ns`, for `duration`.
/// The client connects to `via` (a Service's address) or to the server.
pub fn round_trips(
    client_ns: PathBuf,
    server_ns: PathBuf,
    bind: SocketAddr,
    via: Option<SocketAddr>,
    cpu: usize,
    duration: Duration,
) -> anyhow::Result<(f64, f64)> {
    let (ready, port) = std::sync::mpsc::channel::<anyhow::Result<SocketAddr>>();
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        let listener = (|| {
            enter(&server_ns, cpu)?;
            Ok(TcpListener::bind(bind)?)
        })();
        let listener = match listener {
            Ok(listener) => {
                let _ = ready.send(Ok(listener.local_addr()?));
                listener
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return Ok(());
            }
        };
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        let mut buf = [0u8; MESSAGE];
        while conn.read_exact(&mut buf).is_ok() && conn.write_all(&buf).is_ok() {}
        Ok(())
    });
    let bound = port.recv().context("echo server thread")??;
    let addr = via.unwrap_or(bound);
    let client = std::thread::spawn(move || -> anyhow::Result<Vec<f64>> {
        enter(&client_ns, cpu)?;
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        conn.set_nodelay(true)?;
        let mut buf = [7u8; MESSAGE];
        let mut samples = Vec::with_capacity(200_000);
        let deadline = Instant::now() + duration;
        let mut count = 0usize;
        while Instant::now() < deadline {
            let started = Instant::now();
            conn.write_all(&buf)?;
            conn.read_exact(&mut buf)?;
            count += 1;
            if count > WARMUP {
                samples.push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(samples)
    });
    let mut samples = client
        .join()
        .map_err(|_| anyhow::anyhow!("ping-pong client panicked"))??;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("echo server panicked"))??;
    anyhow::ensure!(
        samples.len() > 100,
        "only {} round trips measured",
        samples.len()
    );
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    Ok((at(0.50), at(0.99)))
}

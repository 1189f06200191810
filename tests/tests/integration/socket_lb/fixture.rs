//! The socket tests' servers and clients: backends in pods that answer
//! with their name, `flatnet-sock-client` runs in the test's cgroup (one
//! exchange, a slow live connection, a resolver that keeps its UDP socket)
//! and the blackhole routes that make an unrewritten ClusterIP die in the
//! client's pod.

use flatnet_harness::RecvThroughSignals;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flatnet_tests::*;
use serde_json::Value;

use super::api::BACKEND_PORT;

pub(super) const TCP: u8 = 6;

pub(super) const UDP: u8 = 17;

/// Servers in a pod answering each TCP connection (after reading it to its
/// end) and each UDP datagram with `name`; stopped on drop.
pub(super) struct Backend {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Backend {
    pub(super) fn start(netns: &Netns, name: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let bind = SocketAddr::from((Ipv6Addr::UNSPECIFIED, BACKEND_PORT));
        let (tcp, udp) = netns.run(|| {
            (
                TcpListener::bind(bind).expect("tcp bind"),
                UdpSocket::bind(bind).expect("udp bind"),
            )
        });
        tcp.set_nonblocking(true).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let tcp_thread = {
            let (stop, name) = (stop.clone(), name.to_string());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((mut conn, _)) => {
                            conn.set_nonblocking(false).unwrap();
                            conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                            let mut request = Vec::new();
                            let _ = conn.read_to_end(&mut request);
                            let _ = conn.write_all(name.as_bytes());
                        }
                        // Non-blocking accept: poll until told to stop.
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        let udp_thread = {
            let (stop, name) = (stop.clone(), name.to_string());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = udp.recv_from_through_signals(&mut buf) {
                        let _ = udp.send_to(name.as_bytes(), from);
                    }
                }
            })
        };
        Backend {
            stop,
            threads: vec![tcp_thread, udp_thread],
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What one client process saw: Ok((answer, peer)) or Err((error, errno)).
pub(crate) type Seen = Result<(String, SocketAddr), (String, Option<i64>)>;

/// `flatnet-sock-client` in `cgroup` and `netns`: `mode` (tcp, tcp-slow,
/// udp) to `to`, sending `payload`.
fn client_command(
    cgroup: &Path,
    netns: &Netns,
    mode: &str,
    to: SocketAddr,
    payload: &str,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flatnet-sock-client"));
    cmd.arg(cgroup)
        .arg(netns.path())
        .args([mode, &to.to_string(), payload])
        .stdout(std::process::Stdio::piped());
    cmd
}

/// A slow TCP client started in the background (one byte every 100 ms),
/// and the answer it ended with.
pub(super) fn live_client(
    cgroup: &Path,
    netns: &Netns,
    to: SocketAddr,
    payload: &str,
) -> std::process::Child {
    client_command(cgroup, netns, "tcp-slow", to, payload)
        .spawn()
        .expect("the live client")
}

pub(super) fn live_answer(live: std::process::Child) -> Value {
    let out = live.wait_with_output().expect("the live client's end");
    serde_json::from_slice(&out.stdout).expect("its JSON line")
}

pub(crate) fn client(cgroup: &Path, netns: &Netns, protocol: &str, to: SocketAddr) -> Seen {
    let out = client_command(cgroup, netns, protocol, to, "request")
        .output()
        .expect("running flatnet-sock-client");
    assert!(out.status.success(), "flatnet-sock-client: {out:?}");
    let line: Value = serde_json::from_slice(&out.stdout).expect("its JSON line");
    match line["answer"].as_str() {
        Some(answer) => Ok((
            answer.to_string(),
            line["peer"].as_str().unwrap().parse().expect("peer"),
        )),
        None => Err((line["error"].to_string(), line["errno"].as_i64())),
    }
}

/// Service addresses a client pod must never send to unrewritten.
pub(super) fn blackhole_services(netns: &Netns) {
    for (family, cidr) in [("-4", "10.96.0.0/16"), ("-6", "fd96::/108")] {
        netns.exec(&["ip", family, "route", "add", "blackhole", cidr]);
    }
}

/// A `udp-resolver` client running in the background and the JSON lines
/// it printed so far, each with when it was read.
pub(super) struct Resolver {
    child: std::process::Child,
    lines: Arc<std::sync::Mutex<Vec<(std::time::Instant, Value)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Resolver {
    pub(super) fn start(cgroup: &Path, netns: &Netns, to: SocketAddr, seconds: u64) -> Self {
        let mut child = client_command(cgroup, netns, "udp-resolver", to, &seconds.to_string())
            .spawn()
            .expect("the resolver client");
        let stdout = child.stdout.take().expect("its stdout");
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let reader = {
            let lines = lines.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                {
                    let value: Value = serde_json::from_str(&line).expect("a JSON line");
                    lines
                        .lock()
                        .unwrap()
                        .push((std::time::Instant::now(), value));
                }
            })
        };
        Resolver {
            child,
            lines,
            reader: Some(reader),
        }
    }

    pub(super) fn answers(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter_map(|(_, line)| line["answer"].as_str().map(str::to_string))
            .collect()
    }

    /// Every line, once the client has ended.
    pub(super) fn finish(mut self) -> Vec<(std::time::Instant, Value)> {
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        std::mem::take(&mut *self.lines.lock().unwrap())
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

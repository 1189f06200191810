//! A client process for the socket load-balancing tests (socket_lb/):
//! cgroup programs act on the processes of their cgroup, so the client must
//! be a process of its own, put in the test's cgroup before it makes its
//! socket, and in the pod's network namespace.
//!
//! Usage: flatnet-sock-client <cgroup dir> <netns path> tcp|tcp-slow|udp|udp-resolver <address:port> <payload>
//! (`tcp-slow`: the payload's bytes one every 100 ms, a connection that
//! lives while something else happens.)
//! Prints one JSON line: {"answer", "peer"} (tcp: what getpeername() says;
//! udp: the source recvfrom() reported), or {"error", "errno"}.
//!
//! `udp-resolver`: a DNS client as nginx's or envoy's resolver is, one
//! *connected* UDP socket asked again and again (every 50 ms, for as many
//! seconds as the payload says), made anew only when a call on it fails.
//! Prints a JSON line per query as it goes: {"answer", "peer"},
//! {"error", "errno"} or {"timeout": true}.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);

fn error(e: std::io::Error) -> serde_json::Value {
    json!({"error": e.kind().to_string(), "errno": e.raw_os_error()})
}

fn tcp(to: SocketAddr, payload: &[u8], slow: bool) -> serde_json::Value {
    let mut conn = match TcpStream::connect_timeout(&to, TIMEOUT) {
        Ok(conn) => conn,
        Err(e) => return error(e),
    };
    let peer = conn.peer_addr().map(|p| p.to_string()).unwrap_or_default();
    let exchange = (|| -> std::io::Result<String> {
        conn.set_read_timeout(Some(TIMEOUT))?;
        if slow {
            for byte in payload {
                conn.write_all(std::slice::from_ref(byte))?;
                std::thread::sleep(Duration::from_millis(100));
            }
        } else {
            conn.write_all(payload)?;
        }
        conn.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    })();
    match exchange {
        Ok(answer) => json!({"answer": answer, "peer": peer}),
        Err(e) => error(e),
    }
}

fn udp(to: SocketAddr, payload: &[u8]) -> serde_json::Value {
    let bind: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let exchange = (|| -> std::io::Result<(String, SocketAddr)> {
        let socket = UdpSocket::bind(bind)?;
        socket.set_read_timeout(Some(TIMEOUT))?;
        socket.send_to(payload, to)?;
        let mut buf = [0u8; 512];
        let (n, from) = socket.recv_from(&mut buf)?;
        Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
    })();
    match exchange {
        Ok((answer, from)) => json!({"answer": answer, "peer": from.to_string()}),
        Err(e) => error(e),
    }
}

fn udp_resolver(to: SocketAddr, seconds: u64) {
    let bind: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let connect = || -> std::io::Result<UdpSocket> {
        let socket = UdpSocket::bind(bind)?;
        socket.connect(to)?;
        socket.set_read_timeout(Some(Duration::from_millis(300)))?;
        Ok(socket)
    };
    let end = std::time::Instant::now() + Duration::from_secs(seconds);
    let mut socket = None;
    let mut out = std::io::stdout().lock();
    while std::time::Instant::now() < end {
        let exchange = (|| -> std::io::Result<(String, String)> {
            if socket.is_none() {
                socket = Some(connect()?);
            }
            let connected = socket.as_ref().unwrap();
            connected.send(b"query")?;
            let mut buf = [0u8; 512];
            let n = connected.recv(&mut buf)?;
            let peer = connected.peer_addr()?.to_string();
            Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), peer))
        })();
        let line = match exchange {
            Ok((answer, peer)) => json!({"answer": answer, "peer": peer}),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                json!({"timeout": true})
            }
            Err(e) => {
                // A resolver's answer to a failed socket: a new one.
                socket = None;
                error(e)
            }
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cgroup, netns, protocol, to, payload] = args.as_slice() else {
        eprintln!(
            "usage: flatnet-sock-client <cgroup dir> <netns path> tcp|tcp-slow|udp|udp-resolver <address:port> <payload>"
        );
        std::process::exit(2);
    };
    // Into the cgroup first: its programs apply to sockets made after.
    let procs = std::path::Path::new(cgroup).join("cgroup.procs");
    if let Err(e) = std::fs::write(&procs, std::process::id().to_string()) {
        eprintln!("joining {}: {e}", procs.display());
        std::process::exit(1);
    }
    let namespace = match std::fs::File::open(netns) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("opening {netns}: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = setns(namespace.as_fd(), CloneFlags::CLONE_NEWNET) {
        eprintln!("entering {netns}: {e}");
        std::process::exit(1);
    }
    let Ok(to) = to.parse::<SocketAddr>() else {
        eprintln!("{to}: not an address:port");
        std::process::exit(2);
    };
    let outcome = match protocol.as_str() {
        "tcp" => tcp(to, payload.as_bytes(), false),
        "tcp-slow" => tcp(to, payload.as_bytes(), true),
        "udp" => udp(to, payload.as_bytes()),
        "udp-resolver" => {
            udp_resolver(to, payload.parse().unwrap_or(5));
            return;
        }
        other => {
            eprintln!("{other}: tcp, tcp-slow, udp or udp-resolver");
            std::process::exit(2);
        }
    };
    println!("{outcome}");
}

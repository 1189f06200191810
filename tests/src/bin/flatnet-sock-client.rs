//! A client process for the socket load-balancing tests (socket_lb.rs):
//! cgroup programs act on the processes of their cgroup, so the client must
//! be a process of its own, put in the test's cgroup before it makes its
//! socket, and in the pod's network namespace.
//!
//! Usage: flatnet-sock-client <cgroup dir> <netns path> tcp|tcp-slow|udp <address:port> <payload>
//! (`tcp-slow`: the payload's bytes one every 100 ms, a connection that
//! lives while something else happens.)
//! Prints one JSON line: {"answer", "peer"} (tcp: what getpeername() says;
//! udp: the source recvfrom() reported), or {"error", "errno"}.

use std::io::{Read, Write};
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cgroup, netns, protocol, to, payload] = args.as_slice() else {
        eprintln!(
            "usage: flatnet-sock-client <cgroup dir> <netns path> tcp|udp <address:port> <payload>"
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
        other => {
            eprintln!("{other}: tcp, tcp-slow or udp");
            std::process::exit(2);
        }
    };
    println!("{outcome}");
}

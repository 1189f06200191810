//! What the NodePort tests run in pods and ask from outside: echo servers
//! that say who asked, a UDP server that answers late, and one TCP or UDP
//! exchange, a refusal, a large datagram or a learned path MTU seen from
//! the client's side.

use flatnet_harness::RecvThroughSignals;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flatnet_tests::*;

use crate::socket_lb::api::BACKEND_PORT;

use super::fixture::LATE_BACKEND_PORT;

/// How late `LateUdp` answers.
pub(super) const LATE_BY: Duration = Duration::from_millis(300);

/// A UDP server in a pod that answers each datagram `LATE_BY` after it
/// came: time for a client to have closed its socket, so its kernel
/// answers the answer with a port unreachable. Both families on one
/// socket. Stopped on drop.
pub(super) struct LateUdp {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LateUdp {
    pub(super) fn start(netns: &Netns) -> Self {
        let socket = netns.run(|| {
            UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, LATE_BACKEND_PORT)).expect("udp bind")
        });
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Room for `LARGE_DATAGRAM`.
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((len, peer)) = socket.recv_from_through_signals(&mut buf) {
                        std::thread::sleep(LATE_BY);
                        let _ = socket.send_to(&buf[..len], peer);
                    }
                }
            })
        };
        LateUdp {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for LateUdp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// TCP and UDP servers in a pod answering with their name and the source
/// address they saw ("local 172.30.0.1"); stopped on drop.
pub(crate) struct Echo {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Echo {
    pub(crate) fn start(netns: &Netns, name: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        // Both families on one socket each (IPV6_V6ONLY off, Linux's
        // default); an IPv4 peer shows as ::ffff:a.b.c.d, printed as IPv4.
        let bind = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, BACKEND_PORT));
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
                        Ok((mut conn, peer)) => {
                            conn.set_nonblocking(false).unwrap();
                            // Long enough for a connection held across an
                            // agent restart on a loaded machine.
                            conn.set_read_timeout(Some(Duration::from_secs(15)))
                                .unwrap();
                            let mut request = Vec::new();
                            let _ = conn.read_to_end(&mut request);
                            let _ = conn.write_all(format!("{name} {}", plain(peer)).as_bytes());
                        }
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
                    if let Ok((_, peer)) = udp.recv_from_through_signals(&mut buf) {
                        let _ = udp.send_to(format!("{name} {}", plain(peer)).as_bytes(), peer);
                    }
                }
            })
        };
        Echo {
            stop,
            threads: vec![tcp_thread, udp_thread],
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A peer's address as its own family prints it.
fn plain(peer: SocketAddr) -> std::net::IpAddr {
    match peer.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// One TCP exchange from `netns` with `to`: the answer ("name source").
pub(crate) fn tcp_ask(netns: &Netns, to: SocketAddr) -> std::io::Result<String> {
    netns.run(|| {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(3)))?;
        conn.write_all(b"request")?;
        conn.shutdown(Shutdown::Write)?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    })
}

/// One UDP exchange from `netns` with `to`: the answer and where it came
/// from.
pub(crate) fn udp_ask(netns: &Netns, to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    netns.run(|| {
        let socket = if to.is_ipv4() {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
        } else {
            UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?
        };
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.send_to(b"request", to)?;
        let mut buf = [0u8; 512];
        let (len, from) = socket.recv_from_through_signals(&mut buf)?;
        Ok((String::from_utf8_lossy(&buf[..len]).into_owned(), from))
    })
}

/// Whether a connected UDP socket in `netns` learns that `to` refuses its
/// datagram (an ICMP port unreachable, reported as ECONNREFUSED).
pub(super) fn udp_refused(netns: &Netns, to: SocketAddr) -> bool {
    let asked = netns.run(|| -> std::io::Result<usize> {
        let socket = if to.is_ipv4() {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
        } else {
            UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?
        };
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(to)?;
        socket.send(b"request")?;
        socket.recv_through_signals(&mut [0u8; 512])
    });
    asked.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// `count` TCP answers from `netns` to `to`, as a set.
pub(super) fn tcp_answers(netns: &Netns, to: SocketAddr, count: usize) -> BTreeSet<String> {
    (0..count)
        .map(|_| tcp_ask(netns, to).unwrap_or_else(|e| panic!("TCP to {to}: {e}")))
        .collect()
}

/// A datagram three fragments long on the underlay's 1,500 bytes.
pub(super) const LARGE_DATAGRAM: usize = 3000;

/// Whether `to` echoes a `LARGE_DATAGRAM`-byte datagram from `netns` whole,
/// from `to`.
pub(super) fn large_datagram_echoed(netns: &Netns, to: SocketAddr) -> bool {
    netns
        .run(|| -> std::io::Result<bool> {
            let socket = if to.is_ipv4() {
                UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
            } else {
                UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?
            };
            socket.set_read_timeout(Some(LATE_BY * 4))?;
            let datagram: Vec<u8> = (0..LARGE_DATAGRAM).map(|i| (i % 251) as u8).collect();
            socket.send_to(&datagram, to)?;
            let mut buf = vec![0u8; LARGE_DATAGRAM * 2];
            let (len, from) = socket.recv_from_through_signals(&mut buf)?;
            Ok(from == to && buf[..len] == datagram[..])
        })
        .unwrap_or(false)
}

/// The path MTU `netns`'s kernel knows toward `to` (IPv6), if it learned one.
fn path_mtu(netns: &Netns, to: SocketAddr) -> Option<u32> {
    let route = netns.exec(&["ip", "-6", "route", "get", &to.ip().to_string()]);
    let mut words = route.split_whitespace();
    words.find(|word| *word == "mtu")?;
    words.next()?.parse().ok()
}

/// Large datagrams from `netns` to `to` until a backend behind a smaller
/// MTU is asked (16 tries at most), whose packet too big teaches the
/// client the path's MTU (IPv6 routers do not fragment); the MTU learned.
pub(super) fn learn_path_mtu(netns: &Netns, to: SocketAddr) -> Option<u32> {
    for _ in 0..16 {
        large_datagram_echoed(netns, to);
        if let Some(mtu) = path_mtu(netns, to).filter(|mtu| *mtu < 1500) {
            return Some(mtu);
        }
    }
    path_mtu(netns, to)
}

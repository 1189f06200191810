//! Traffic between namespaces: TCP echo, one UDP datagram and the source
//! it arrived with, a TCP stream kept up while something else runs, a
//! server of short request/response connections.

use flatnet_harness::{ReadThroughSignals, RecvThroughSignals};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::{Netns, enter_thread};

/// Opens a TCP echo server in `server_ns` on `ip`, connects from
/// `client_ns`, sends `bytes` bytes and checks they all come back intact.
pub fn tcp_echo(
    server_ns: Option<&Netns>,
    ip: impl Into<std::net::IpAddr>,
    client_ns: Option<&Netns>,
    bytes: usize,
) -> anyhow::Result<()> {
    tcp_echo_via(server_ns, (ip.into(), 0).into(), client_ns, None, bytes)
}

/// `tcp_echo` with the server bound to `bind` and the client connecting to
/// `connect` (a port mapping's address), or to the server's own address.
pub fn tcp_echo_via(
    server_ns: Option<&Netns>,
    bind: SocketAddr,
    client_ns: Option<&Netns>,
    connect: Option<SocketAddr>,
    bytes: usize,
) -> anyhow::Result<()> {
    echo_through(server_ns, bind, client_ns, connect, bytes).map(|_| ())
}

/// `tcp_echo_via`'s work: the source address the server saw.
fn echo_through(
    server_ns: Option<&Netns>,
    bind: SocketAddr,
    client_ns: Option<&Netns>,
    connect: Option<SocketAddr>,
    bytes: usize,
) -> anyhow::Result<IpAddr> {
    let listener = in_ns(server_ns, || TcpListener::bind(bind))?;
    let local = listener.local_addr()?;
    let addr = connect.unwrap_or(local);
    let server = std::thread::spawn(move || -> anyhow::Result<IpAddr> {
        let (mut conn, peer) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = conn.read_through_signals(&mut buf)?;
            if n == 0 {
                return Ok(peer.ip());
            }
            conn.write_all(&buf[..n])?;
        }
    });
    let payload: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let echoed = in_ns(client_ns, || -> anyhow::Result<Vec<u8>> {
        tcp_client(addr, &payload)
    });
    let echoed = match echoed {
        Ok(echoed) => echoed,
        Err(e) => {
            // Unblock the server's accept so its thread ends.
            let _ = in_ns(server_ns, || {
                TcpStream::connect_timeout(&bind_target(local), Duration::from_secs(1))
            });
            let _ = server.join();
            return Err(e);
        }
    };
    let source = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    anyhow::ensure!(
        echoed == payload,
        "echo differs: sent {} bytes, got {}",
        payload.len(),
        echoed.len()
    );
    Ok(source)
}

/// Where to reach a listener bound to `bind` from its own namespace.
fn bind_target(bind: SocketAddr) -> SocketAddr {
    if bind.ip().is_unspecified() {
        SocketAddr::from((Ipv4Addr::LOCALHOST, bind.port()))
    } else {
        bind
    }
}

fn tcp_client(addr: SocketAddr, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = conn.try_clone()?;
    let data = payload.to_vec();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        writer.write_all(&data)?;
        writer.shutdown(std::net::Shutdown::Write)
    });
    let mut echoed = Vec::with_capacity(payload.len());
    conn.read_to_end(&mut echoed)?;
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    Ok(echoed)
}

/// Runs `f` in `ns` (on a thread that entered it), or here for the host.
pub fn in_ns<T: Send>(ns: Option<&Netns>, f: impl FnOnce() -> T + Send) -> T {
    match ns {
        Some(ns) => ns.run(f),
        None => f(),
    }
}

/// Sends one datagram of `len` bytes from `from` (bound to `from_ip`, DF
/// off so a node may fragment it) to a socket bound in `to` at `to_ip`;
/// the source address it arrived with.
pub fn udp_source(
    from: &Netns,
    from_ip: Ipv4Addr,
    to: &Netns,
    to_ip: Ipv4Addr,
    len: usize,
) -> IpAddr {
    let receiver = to
        .run(|| UdpSocket::bind((to_ip, 0)))
        .expect("bind receiver");
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let target = receiver.local_addr().unwrap();
    let payload = vec![0x5a_u8; len];
    from.run(|| {
        let socket = UdpSocket::bind((from_ip, 0)).unwrap();
        let dont = nix::libc::IP_PMTUDISC_DONT;
        // SAFETY: a valid socket and an int option of the size given.
        let rc = unsafe {
            nix::libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                nix::libc::IPPROTO_IP,
                nix::libc::IP_MTU_DISCOVER,
                (&dont as *const i32).cast(),
                size_of::<i32>() as u32,
            )
        };
        assert_eq!(rc, 0, "IP_MTU_DISCOVER");
        socket.send_to(&payload, target).unwrap();
    });
    let mut buf = vec![0u8; 2048];
    let (got, source) = receiver
        .recv_from_through_signals(&mut buf)
        .expect("the datagram did not arrive");
    assert_eq!(&buf[..got], &payload[..]);
    source.ip()
}

/// Connects over TCP from `from` (its routes choose the source) to a
/// listener bound in `to` at `to_ip`, sends `len` bytes and reads them
/// back; the source address the connection arrived with.
pub fn tcp_source(from: &Netns, to: &Netns, to_ip: IpAddr, len: usize) -> IpAddr {
    echo_through(Some(to), (to_ip, 0).into(), Some(from), None, len)
        .unwrap_or_else(|e| panic!("the TCP echo to {to_ip} failed: {e}"))
}

/// Streams bytes from `client` to a server in `server` while `during`
/// runs; returns (sent, received). A reset or stall fails the test.
pub fn stream_during(
    server: &Netns,
    ip: impl Into<std::net::IpAddr>,
    client: &Netns,
    during: impl FnOnce(),
) -> (u64, u64) {
    let ip = ip.into();
    let listener = server.run(|| TcpListener::bind((ip, 0)).unwrap());
    let addr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match conn.read_through_signals(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n as u64,
                Err(e) => panic!("receiver: {e} after {total} bytes"),
            }
        }
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client_path = client.path();
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            enter_thread(&client_path).expect("enter the client's namespace");
            let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            conn.set_write_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let chunk = vec![7u8; 16 * 1024];
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = conn.write_all(&chunk) {
                    panic!("sender: {e} after {sent} bytes");
                }
                sent += chunk.len() as u64;
                // Paced, so the stream spans the whole of `during`.
                std::thread::sleep(Duration::from_micros(200));
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    during();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender");
    let received = receiver.join().expect("receiver");
    (sent, received)
}

/// Serves short exchanges on TCP `port` (IPv4) in a namespace: per
/// connection, `message` bytes read and the same written back, then a
/// close. Each of its threads waits for the next connection in poll(2),
/// so it takes it as soon as it arrives (a sleep between accept tries
/// would add its own delay to every connection); a connection whose
/// client goes quiet is given up after 2 s, so no thread stalls. Stopped
/// on drop.
pub struct ExchangeServer {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ExchangeServer {
    /// `threads` connections served at once.
    pub fn start(netns: &Netns, port: u16, message: usize, threads: usize) -> Self {
        let listener = netns
            .run(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
            .expect("exchange server bind");
        // A connection reset between poll and accept must not block a stop.
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                let listener = listener.try_clone().expect("listener clone");
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; message];
                    while !stop.load(Ordering::Relaxed) {
                        let mut ready = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                        if !matches!(poll(&mut ready, PollTimeout::from(100u8)), Ok(n) if n > 0) {
                            continue;
                        }
                        // Another thread may have taken it.
                        let Ok((mut conn, _)) = listener.accept() else {
                            continue;
                        };
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_nodelay(true);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                        if conn.read_exact(&mut buf).is_ok() {
                            let _ = conn.write_all(&buf);
                        }
                    }
                })
            })
            .collect();
        ExchangeServer { stop, threads }
    }
}

impl Drop for ExchangeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

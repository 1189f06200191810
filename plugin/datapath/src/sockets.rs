//! Destroying connected sockets (`SOCK_DESTROY` over sock_diag, the
//! kernel's `CONFIG_INET_DIAG_DESTROY`): what `ss -K` does, for every
//! network namespace that has a process in it.
//!
//! Why: a Service's backend is picked once per connect(). A TCP connection
//! or a *connected* UDP socket (DNS clients in nginx, haproxy, envoy) then
//! talks to that backend for as long as it lives, and when the backend pod
//! is gone its packets vanish: the client hangs on timeouts instead of
//! moving on. Destroying the socket fails its next call (ECONNABORTED), and
//! the client's next connect() is balanced to a live backend.
//!
//! Which sockets: the caller decides per socket (`condemn`), from the peer
//! and the socket's cookie, the same cookie `bpf_get_socket_cookie` gives
//! the socket programs.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::{AF_INET, AF_INET6, SockDiagDestroy, SockDiagMessage};
use netlink_sys::{Socket, protocols::NETLINK_SOCK_DIAG};

use crate::error::{Error, Result};
use crate::netns;

/// IP protocol numbers of the sockets looked at.
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;

/// TCP states of a connection a peer can be gone from: everything but
/// LISTEN, CLOSE and TIME_WAIT (no socket left to fail). For UDP the
/// kernel reports a connected socket as ESTABLISHED.
fn states(protocol: u8) -> StateFlags {
    if protocol == UDP {
        return StateFlags::ESTABLISHED;
    }
    StateFlags::all() - StateFlags::LISTEN - StateFlags::CLOSE - StateFlags::TIME_WAIT
}

/// A connected socket as sock_diag reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    pub protocol: u8,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub cookie: u64,
    id: SocketId,
    family: u8,
}

/// What one pass did: sockets destroyed, and namespaces that could not be
/// searched (a process that exited meanwhile is not one of them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Destroyed {
    pub sockets: Vec<Connected>,
    pub namespaces_searched: usize,
    pub failures: Vec<String>,
}

/// sock_diag's 8-byte cookie: two native-endian u32s, low half first.
fn cookie_of(bytes: [u8; 8]) -> u64 {
    let low = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let high = u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    u64::from(low) | (u64::from(high) << 32)
}

/// One network namespace of each process (`/proc/<pid>/ns/net`), once per
/// namespace; the agent's own among them.
pub fn process_namespaces() -> Vec<File> {
    let mut seen = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| {
            let path = entry.path().join("ns/net");
            // The process may have exited: skipped, its sockets went with it.
            let file = netns::open(&path).ok()?;
            let meta = file.metadata().ok()?;
            seen.insert((meta.dev(), meta.ino())).then_some(file)
        })
        .collect()
}

fn sock_diag_socket() -> Result<Socket> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)
        .map_err(|e| Error::io("opening a sock_diag netlink socket", e))?;
    socket
        .bind_auto()
        .map_err(|e| Error::io("binding the sock_diag socket", e))?;
    socket
        .connect(&netlink_sys::SocketAddr::new(0, 0))
        .map_err(|e| Error::io("connecting the sock_diag socket", e))?;
    Ok(socket)
}

fn send<I: NetlinkSerializable>(socket: &Socket, flags: u16, payload: I) -> Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
    message.finalize();
    let mut buf = vec![0; message.buffer_len()];
    message.serialize(&mut buf);
    socket
        .send(&buf, 0)
        .map(|_| ())
        .map_err(|e| Error::io("sending to sock_diag", e))
}

/// The current namespace's connected sockets of `protocol` and `family`.
fn dump(socket: &Socket, protocol: u8, family: u8) -> Result<Vec<Connected>> {
    let request = InetRequest {
        family,
        protocol,
        extensions: ExtensionFlags::empty(),
        states: states(protocol),
        socket_id: if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        },
    };
    send(
        socket,
        NLM_F_REQUEST | NLM_F_DUMP,
        SockDiagMessage::InetRequest(request),
    )?;
    let mut found = Vec::new();
    loop {
        let (buf, _) = socket
            .recv_from_full()
            .map_err(|e| Error::io("reading sock_diag's dump", e))?;
        let mut offset = 0;
        while offset < buf.len() {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[offset..])
                .map_err(|e| Error::kernel("decoding sock_diag's dump", e))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                    let id = &response.header.socket_id;
                    found.push(Connected {
                        protocol,
                        local: SocketAddr::new(id.source_address, id.source_port),
                        peer: SocketAddr::new(id.destination_address, id.destination_port),
                        cookie: cookie_of(id.cookie),
                        id: id.clone(),
                        family,
                    });
                }
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(Error::kernel(
                        "sock_diag's dump",
                        std::io::Error::from_raw_os_error(-e.raw_code()),
                    ));
                }
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

/// Destroys one socket; Ok(false) when it was already gone.
fn destroy(socket: &Socket, connected: &Connected) -> Result<bool> {
    let request = InetRequest {
        family: connected.family,
        protocol: connected.protocol,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id: connected.id.clone(),
    };
    send(
        socket,
        NLM_F_REQUEST | NLM_F_ACK,
        SockDiagDestroy::new(SockDiagMessage::InetRequest(request)),
    )?;
    let (buf, _) = socket
        .recv_from_full()
        .map_err(|e| Error::io("reading sock_diag's answer", e))?;
    let answer = NetlinkMessage::<SockDiagMessage>::deserialize(&buf)
        .map_err(|e| Error::kernel("decoding sock_diag's answer", e))?;
    match answer.payload {
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(true),
            Some(_) if -e.raw_code() == libc::ENOENT => Ok(false),
            Some(_) => Err(Error::kernel(
                format!(
                    "destroying {:?} socket to {}",
                    connected.protocol, connected.peer
                ),
                std::io::Error::from_raw_os_error(-e.raw_code()),
            )),
        },
        other => Err(Error::kernel(
            "sock_diag's answer to SOCK_DESTROY",
            format!("{other:?}"),
        )),
    }
}

/// In the current thread's namespace: destroys the TCP and UDP sockets
/// (both families) connected to one of `peers` that `condemn` agrees to.
fn destroy_here(
    peers: &BTreeSet<(u8, SocketAddr)>,
    condemn: &dyn Fn(&Connected) -> bool,
) -> Result<Vec<Connected>> {
    let socket = sock_diag_socket()?;
    let mut destroyed = Vec::new();
    let protocols: BTreeSet<u8> = peers.iter().map(|(protocol, _)| *protocol).collect();
    for protocol in protocols {
        for family in [AF_INET, AF_INET6] {
            for connected in dump(&socket, protocol, family)? {
                if peers.contains(&(protocol, connected.peer))
                    && condemn(&connected)
                    && destroy(&socket, &connected)?
                {
                    destroyed.push(connected);
                }
            }
        }
    }
    Ok(destroyed)
}

/// In every namespace with a process: destroys the sockets of `protocol`
/// connected to a peer in `peers` that `condemn` agrees to. Each namespace
/// is searched from a thread of its own, which leaves with it.
pub fn destroy_connected(
    peers: &BTreeSet<(u8, SocketAddr)>,
    condemn: &(dyn Fn(&Connected) -> bool + Sync),
) -> Destroyed {
    let mut outcome = Destroyed::default();
    if peers.is_empty() {
        return outcome;
    }
    for namespace in process_namespaces() {
        let searched = std::thread::scope(|scope| {
            scope
                // A thread of its own: the caller's thread never changes
                // namespace, whatever happens here.
                .spawn(|| netns::within(&namespace, || destroy_here(peers, condemn))?)
                .join()
        });
        outcome.namespaces_searched += 1;
        match searched {
            Ok(Ok(sockets)) => outcome.sockets.extend(sockets),
            Ok(Err(e)) => outcome.failures.push(e.to_string()),
            Err(_) => outcome.failures.push("a search thread panicked".into()),
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_two_native_halves_low_first() {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&0x1122_3344u32.to_ne_bytes());
        bytes[4..].copy_from_slice(&0x5566_7788u32.to_ne_bytes());
        assert_eq!(cookie_of(bytes), 0x5566_7788_1122_3344);
    }

    #[test]
    fn udp_looks_at_connected_sockets_and_tcp_at_live_connections() {
        assert_eq!(states(UDP), StateFlags::ESTABLISHED);
        let tcp = states(TCP);
        assert!(tcp.contains(StateFlags::ESTABLISHED | StateFlags::SYN_SENT));
        assert!(!tcp.intersects(StateFlags::LISTEN | StateFlags::TIME_WAIT));
    }
}

//! UDP receives that carry on through signals. With a receive timeout set
//! (SO_RCVTIMEO), a signal handled anywhere in the process (SIGCHLD, as
//! tokio's child reaper installs it, when any child of the test binary
//! exits) fails recv with EINTR even under SA_RESTART (signal(7)). That is
//! neither a datagram nor a timeout, so a probe must not read it as either.

use std::io::{ErrorKind, Result};
use std::net::{SocketAddr, UdpSocket};

pub trait RecvThroughSignals {
    fn recv_through_signals(&self, buf: &mut [u8]) -> Result<usize>;
    fn recv_from_through_signals(&self, buf: &mut [u8]) -> Result<(usize, SocketAddr)>;
}

impl RecvThroughSignals for UdpSocket {
    fn recv_through_signals(&self, buf: &mut [u8]) -> Result<usize> {
        loop {
            match self.recv(buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                outcome => return outcome,
            }
        }
    }

    fn recv_from_through_signals(&self, buf: &mut [u8]) -> Result<(usize, SocketAddr)> {
        loop {
            match self.recv_from(buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                outcome => return outcome,
            }
        }
    }
}

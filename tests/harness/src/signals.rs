//! Socket receives that carry on through signals. With a receive timeout
//! set (SO_RCVTIMEO), a signal handled anywhere in the process (SIGCHLD, as
//! tokio's child reaper installs it, when any child of the test binary
//! exits) fails recv and read with EINTR even under SA_RESTART
//! (signal(7)). That is neither data nor a timeout, so a probe or a
//! stream's reader must not read it as either. (std's `read_exact`,
//! `read_to_end` and `write_all` retry on their own; a bare `read` does
//! not.)

use std::io::{ErrorKind, Read, Result};
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

pub trait ReadThroughSignals {
    fn read_through_signals(&mut self, buf: &mut [u8]) -> Result<usize>;
}

impl<R: Read> ReadThroughSignals for R {
    fn read_through_signals(&mut self, buf: &mut [u8]) -> Result<usize> {
        loop {
            match self.read(buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                outcome => return outcome,
            }
        }
    }
}

//! Which ports frontends for clients outside the node listen on
//! (`EXTERNAL_PORTS`): asked by the NodePort path and by the socket
//! programs, an array read before any hash lookup.

use flatnet_common::external_port;

use crate::maps::nodeport::EXTERNAL_PORTS;

/// What listens on `port` (host order): its `EXTERNAL_PORTS` entry, both
/// halves together (0: nothing). An array read.
#[inline(always)]
pub(crate) fn listening_on(port: u16) -> u32 {
    EXTERNAL_PORTS.get_ptr(u32::from(port)).map_or(0, |entry| {
        // SAFETY: a valid map value for the program's run; read once.
        external_port::listening(unsafe { core::ptr::read_volatile(entry) })
    })
}

/// Whether a NodePort of IP protocol `protocol` listens on `port` (host
/// order): an array read, before any hash lookup of a node address.
#[inline(always)]
pub(crate) fn nodeport_listens(port: u16, protocol: u8) -> bool {
    listening_on(port) & external_port::nodeport_bit(protocol) != 0
}

/// Whether any frontend listens for clients outside the node (NodePort,
/// external address, hostPort): only then can a pod's packet be the reply
/// of a translated flow.
#[inline(always)]
pub(crate) fn any_listening() -> bool {
    listening_on(external_port::ANY_PORT) != 0
}

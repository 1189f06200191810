//! The one ethtool setting flatnet changes: transmit checksum offload.

use crate::error::{Error, Result};
use std::os::fd::AsRawFd;

/// Turns tx checksum offload of `ifname` (in the current thread's
/// namespace) on or off, with the ethtool ioctl. XDP mode needs it off on
/// both veth ends: a frame that goes through XDP redirect is rebuilt on the
/// far side without the "checksum still to be filled in" state it left with.
pub fn set_tx_checksum(ifname: &str, on: bool) -> Result<()> {
    /// From linux/ethtool.h and linux/sockios.h.
    const ETHTOOL_STXCSUM: u32 = 0x17;
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IF_NAMESIZE],
        data: *mut EthtoolValue,
        _rest: [u8; 16],
    }
    let context = || format!("setting tx checksumming of {ifname}");
    if ifname.len() >= libc::IF_NAMESIZE {
        return Err(Error::kernel(context(), "interface name too long"));
    }
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::kernel(context(), e))?;
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: u32::from(on),
    };
    let mut request = IfReq {
        name: [0; libc::IF_NAMESIZE],
        data: &mut value,
        _rest: [0; 16],
    };
    request.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value it points
    // to; both live on this stack frame for the duration of the call.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), SIOCETHTOOL as _, &mut request) };
    if rc < 0 {
        return Err(Error::kernel(context(), std::io::Error::last_os_error()));
    }
    Ok(())
}

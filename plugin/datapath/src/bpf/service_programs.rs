//! The Service socket programs (connect, sendmsg, recvmsg, getpeername;
//! both families) attached to a cgroup v2 directory through pinned links.

use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use flatnet_common::{
    GLOBAL_NODE_NETNS_COOKIE, PROG_SERVICE_CONNECT4, PROG_SERVICE_CONNECT6,
    PROG_SERVICE_GETPEERNAME4, PROG_SERVICE_GETPEERNAME6, PROG_SERVICE_RECVMSG4,
    PROG_SERVICE_RECVMSG6, PROG_SERVICE_SENDMSG4, PROG_SERVICE_SENDMSG6,
};

use super::attach::{pin_link, remove_if_there};
use aya::EbpfLoader;
use flatnet_common::MAPS;

use super::{Datapath, OBJECT};
use crate::error::{Error, Result};

/// The socket programs, in the order they are attached.
pub const SERVICE_PROGRAMS: [&str; 8] = [
    PROG_SERVICE_CONNECT4,
    PROG_SERVICE_CONNECT6,
    PROG_SERVICE_SENDMSG4,
    PROG_SERVICE_SENDMSG6,
    PROG_SERVICE_RECVMSG4,
    PROG_SERVICE_RECVMSG6,
    PROG_SERVICE_GETPEERNAME4,
    PROG_SERVICE_GETPEERNAME6,
];

impl Datapath {
    /// Where the link of socket program `program` is pinned.
    pub fn service_link_path(&self, program: &str) -> PathBuf {
        self.links_dir().join(format!("cgroup-{program}"))
    }

    /// Attaches the socket programs of this build to the cgroup v2
    /// directory `cgroup` (the node's root cgroup in production) through
    /// pinned links. Links already pinned (an earlier start, an older build)
    /// are replaced after the new ones are attached: both run for a moment,
    /// and the second finds no frontend at the address the first rewrote.
    pub fn attach_services(&self, cgroup: &Path) -> Result<()> {
        let cgroup_dir = std::fs::File::open(cgroup)
            .map_err(|e| Error::io(format!("opening the cgroup {}", cgroup.display()), e))?;
        let map_pins: Vec<(&str, PathBuf)> = MAPS.iter().map(|m| (*m, self.map_path(m))).collect();
        let mut loader = EbpfLoader::new();
        for (name, path) in &map_pins {
            loader.map_pin_path(name, path.as_path());
        }
        // The node's processes are the loader's namespace's: their
        // datagrams to the node's own NodePorts keep the node's address.
        let node_netns = netns_cookie()?;
        loader.override_global(GLOBAL_NODE_NETNS_COOKIE, &node_netns, true);
        let object = super::kfunc::resolve(OBJECT)?;
        let mut ebpf = loader
            .load(object.bytes())
            .map_err(|e| Error::bpf("loading the eBPF object", e))?;
        for name in SERVICE_PROGRAMS {
            let program: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or_else(|| Error::Datapath(format!("the eBPF object has no program {name}")))?
                .try_into()
                .map_err(|e| Error::bpf(format!("{name} is no cgroup sock_addr program"), e))?;
            super::load::verify(|| program.load())
                .map_err(|e| Error::bpf(format!("verifying {name}"), e))?;
            // A BPF link on a cgroup takes no flags (Single is 0) and runs
            // alongside other programs there anyway, as with ALLOW_MULTI.
            let id = program
                .attach(&cgroup_dir, CgroupAttachMode::Single)
                .map_err(|e| Error::bpf(format!("attaching {name} to {}", cgroup.display()), e))?;
            let link = program
                .take_link(id)
                .map_err(|e| Error::bpf(format!("taking the link of {name}"), e))?;
            let link =
                FdLink::try_from(link).map_err(|e| Error::bpf(format!("the link of {name}"), e))?;
            let pin = self.service_link_path(name);
            // bpffs takes no dots in names.
            let temp = self
                .links_dir()
                .join(format!("cgroup-{name}-new{}", std::process::id()));
            pin_link(link, &temp)?;
            // The old link (if any) detaches when its pin goes: the new one
            // is in place already.
            remove_if_there(&pin)?;
            std::fs::rename(&temp, &pin)
                .map_err(|e| Error::io(format!("renaming {}", temp.display()), e))?;
        }
        Ok(())
    }

    /// Whether the socket programs are attached through pinned links.
    pub fn services_attached(&self) -> bool {
        SERVICE_PROGRAMS
            .iter()
            .all(|name| PinnedLink::from_pin(self.service_link_path(name)).is_ok())
    }

    /// Detaches the socket programs (their pins were the links' last
    /// references).
    pub fn detach_services(&self) -> Result<()> {
        for name in SERVICE_PROGRAMS {
            remove_if_there(&self.service_link_path(name))?;
        }
        Ok(())
    }
}

/// This process's network namespace cookie, as `bpf_get_netns_cookie` gives
/// it to the socket programs: SO_NETNS_COOKIE of a socket of its own (nix
/// has no wrapper for it).
fn netns_cookie() -> Result<u64> {
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::io("a socket for the netns cookie", e.into()))?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and a u64 with its size for the option's value.
    let done = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if done != 0 {
        return Err(Error::io(
            "reading SO_NETNS_COOKIE",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(cookie)
}

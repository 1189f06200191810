//! Which program goes where, and what holds it there.
//!
//! On a kernel with tcx (Linux 6.6+), every tc program is attached through
//! a BPF link (`BPF_TCX_INGRESS`) and XDP through an XDP link, each pinned
//! under the network's pin directory in `links/`, one per device and role.
//! A link is what keeps a program on its device: it goes with the device,
//! an upgrade swaps the program inside it atomically (`bpf_link_update`),
//! and a pinned link of ours is updated or replaced, never added to, so a
//! crashed ADD cannot leave a second flatnet program on a hook (a link not
//! yet pinned dies with the process that made it). flatnet's programs sit
//! last on their hook: programs others attach there (policy, monitoring)
//! see the frame first.
//!
//! Without tcx, the fallback is what flatnet did before: a direct-action
//! cls_bpf filter at a fixed priority and handle on a clsact qdisc,
//! replaced in place by netlink. The choice is probed once per process
//! (`attach_mode`) and reported by STATUS and `flatnet inspect`.

use std::sync::OnceLock;

use aya::programs::links::{FdLink, LinkOrder, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions, TcAttachType};
use aya::programs::xdp::{XdpLink, XdpMode};
use aya::programs::{SchedClassifier, Xdp};

use std::path::{Path, PathBuf};

use flatnet_common::PROG_TO_POD;

use super::Datapath;
use crate::error::{Error, Result};
use crate::netlink::{Netlink, TcHook};

/// How tc programs are attached on this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// BPF links (tcx), pinned.
    Tcx,
    /// Netlink cls_bpf filters on a clsact qdisc: the kernel has no tcx.
    Netlink,
}

impl AttachMode {
    pub fn describe(self) -> &'static str {
        match self {
            AttachMode::Tcx => "tcx (BPF links, pinned under links/)",
            AttachMode::Netlink => {
                "netlink cls_bpf filters (no tcx in this kernel, or FLATNET_ATTACH=netlink)"
            }
        }
    }
}

/// Set to `netlink` to attach with cls_bpf filters even where tcx exists: how
/// a node ran before tcx, kept so the migration from it can be tested.
pub const ATTACH_ENV: &str = "FLATNET_ATTACH";

/// Whether this kernel has tcx: asking which programs sit at tcx ingress of
/// the loopback device succeeds where it exists. Asked once per process.
pub fn attach_mode() -> AttachMode {
    static MODE: OnceLock<AttachMode> = OnceLock::new();
    *MODE.get_or_init(|| {
        if std::env::var(ATTACH_ENV).is_ok_and(|v| v == "netlink") {
            return AttachMode::Netlink;
        }
        match SchedClassifier::query_tcx("lo", TcAttachType::Ingress) {
            Ok(_) => AttachMode::Tcx,
            Err(_) => AttachMode::Netlink,
        }
    })
}

/// The role a link plays, in its pin's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkRole {
    /// The host-side program on a pod's host veth (named by that veth).
    HostVeth,
    /// `pod_xdp_pass` on the pod's own interface (named by the host veth).
    PodSide,
    /// `from_uplink` on the node's uplink (named by the uplink).
    Uplink,
    /// `to_uplink` at tcx egress of the node's uplink (named by the uplink).
    UplinkEgress,
    /// `to_pod` at tcx egress of a pod's host veth (named by that veth):
    /// on every pod's veth where tcx exists.
    ToPod,
    /// `from_pod_passed` at tcx ingress of a pod's host veth in XDP mode
    /// (named by that veth), behind its XDP program.
    Passed,
    /// `from_tunnel` at tcx ingress of the node's VXLAN device.
    Tunnel,
    /// `to_uplink` at tcx egress of the node's VXLAN device.
    TunnelEgress,
}

impl LinkRole {
    fn prefix(self) -> &'static str {
        match self {
            LinkRole::HostVeth => "veth",
            LinkRole::PodSide => "pod",
            LinkRole::Uplink => "uplink",
            LinkRole::UplinkEgress => "uplink-out",
            LinkRole::ToPod => "egress",
            LinkRole::Passed => "ingress",
            LinkRole::Tunnel => "tunnel",
            LinkRole::TunnelEgress => "tunnel-out",
        }
    }

    /// The tcx hook of the role's program.
    fn tc_attach_type(self) -> TcAttachType {
        match self {
            LinkRole::ToPod | LinkRole::UplinkEgress | LinkRole::TunnelEgress => {
                TcAttachType::Egress
            }
            _ => TcAttachType::Ingress,
        }
    }
}

/// The links of a pod's veth pair, named by its host veth.
const POD_ROLES: [LinkRole; 4] = [
    LinkRole::HostVeth,
    LinkRole::PodSide,
    LinkRole::ToPod,
    LinkRole::Passed,
];

/// Why one try at a tcx link failed.
enum Attach {
    /// Another process attached the same program to the hook a moment ago.
    Raced,
    Failed(Error),
}

impl From<Error> for Attach {
    fn from(e: Error) -> Self {
        Attach::Failed(e)
    }
}

fn link_err(context: String, err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::bpf(&context, err)
}

impl Datapath {
    /// Where the network's links are pinned.
    pub fn links_dir(&self) -> PathBuf {
        self.dir.join("links")
    }

    /// Where the link of `role` for device `name` is pinned.
    pub fn link_path(&self, role: LinkRole, name: &str) -> PathBuf {
        // Device names may hold dots (flatnet.vxlan, VLANs), which bpffs
        // refuses.
        self.links_dir()
            .join(format!("{}-{}", role.prefix(), super::pin_name(name)))
    }

    /// Puts this build's tc `program` at tcx ingress (egress for
    /// `LinkRole::ToPod`) of `ifname` through
    /// the pinned link of `role`: the link gets the new program in place
    /// while it still holds its device, else a new link replaces the pin.
    ///
    /// Two processes may make the same link at once (ADD's work after its
    /// answer and the agent writing the pod's policy): the kernel refuses
    /// the second (EEXIST: this program is on the hook already) while the
    /// first pins its link; the second then finds the pin and updates it.
    pub fn attach_tc_link(&self, program: &str, role: LinkRole, ifname: &str) -> Result<()> {
        let mut tries = 0;
        loop {
            match self.try_attach_tc_link(program, role, ifname) {
                Err(Attach::Raced) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(Attach::Raced) => {
                    return Err(Error::Datapath(format!(
                        "attaching {program} to {ifname} (tcx): the hook holds it, \
                         but no link of ours is pinned at {}",
                        self.link_path(role, ifname).display()
                    )));
                }
                Err(Attach::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }

    fn try_attach_tc_link(
        &self,
        program: &str,
        role: LinkRole,
        ifname: &str,
    ) -> std::result::Result<(), Attach> {
        let pin = self.link_path(role, ifname);
        let mut prog = SchedClassifier::from_pin(self.program_path(program))
            .map_err(|e| link_err(format!("opening {program}"), e))?;
        if let Ok(pinned) = PinnedLink::from_pin(&pin) {
            let updated = SchedClassifierLink::try_from(FdLink::from(pinned))
                .map_err(|e| link_err(format!("reading {}", pin.display()), e))
                .and_then(|link| {
                    prog.attach_to_link(link)
                        .map_err(|e| link_err(format!("updating {}", pin.display()), e))
                });
            if let Ok(id) = updated {
                // Dropping our handle closes an fd: the pin holds the link.
                drop(prog.take_link(id));
                return Ok(());
            }
            // The link's device is gone (a veth of the same name was made
            // anew): the pin only names a dead link.
        }
        remove_if_there(&pin)?;
        let id = match prog.attach_with_options(
            ifname,
            role.tc_attach_type(),
            TcAttachOptions::TcxOrder(LinkOrder::last()),
        ) {
            Ok(id) => id,
            Err(aya::programs::ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                return Err(Attach::Raced);
            }
            Err(e) => {
                return Err(link_err(format!("attaching {program} to {ifname} (tcx)"), e).into());
            }
        };
        let link = prog
            .take_link(id)
            .map_err(|e| link_err(format!("taking the link of {program}"), e))?;
        crate::trace::mark("tcx link made, not pinned yet");
        Ok(pin_link(
            FdLink::try_from(link).map_err(|e| link_err("a tcx link".into(), e))?,
            &pin,
        )?)
    }

    /// Puts this build's XDP `program` on `ifname` (in the calling thread's
    /// namespace) through the pinned XDP link of `role` named `name`: updated
    /// in place, or replacing a dead pin, or a program attached the old way
    /// (netlink) on that device.
    pub fn attach_xdp_link(
        &self,
        program: &str,
        role: LinkRole,
        name: &str,
        ifname: &str,
    ) -> Result<()> {
        let pin = self.link_path(role, name);
        let mut prog = Xdp::from_pin(
            self.program_path(program),
            aya_obj::programs::XdpAttachType::Interface,
        )
        .map_err(|e| link_err(format!("opening {program}"), e))?;
        if let Ok(pinned) = PinnedLink::from_pin(&pin) {
            let updated = XdpLink::try_from(FdLink::from(pinned))
                .map_err(|e| link_err(format!("reading {}", pin.display()), e))
                .and_then(|link| {
                    prog.attach_to_link(link)
                        .map_err(|e| link_err(format!("updating {}", pin.display()), e))
                });
            if let Ok(id) = updated {
                drop(prog.take_link(id));
                return Ok(());
            }
        }
        remove_if_there(&pin)?;
        let attached = match prog.attach(ifname, XdpMode::Driver) {
            Ok(id) => id,
            // A program attached through netlink (an older flatnet) holds
            // the device: take it off, then link.
            Err(_) => {
                detach_netlink_xdp(ifname)?;
                prog.attach(ifname, XdpMode::Driver).map_err(|e| {
                    link_err(format!("attaching {program} to {ifname} (XDP link)"), e)
                })?
            }
        };
        let link = prog
            .take_link(attached)
            .map_err(|e| link_err(format!("taking the link of {program}"), e))?;
        pin_link(
            FdLink::try_from(link).map_err(|e| link_err("an XDP link".into(), e))?,
            &pin,
        )
    }

    /// Puts this build's `to_pod` on host veth `ifname`'s egress: the
    /// upgrade's atomic swap inside the pinned link, or a new link. Every
    /// pod gets it where tcx exists: it enforces ingress policy on what the
    /// stack delivers, and it is how the fast path learns that the stack
    /// carried a flow (`FLOWS` in the eBPF crate's flow.rs). Creating a tcx
    /// link waits for an RCU grace period (~10 ms here): ADD does it after
    /// its answer.
    pub fn update_to_pod_link(&self, ifname: &str) -> Result<()> {
        if attach_mode() != AttachMode::Tcx {
            return Ok(());
        }
        self.attach_tc_link(PROG_TO_POD, LinkRole::ToPod, ifname)
    }

    /// Unpins the links of `roles` named `name` (a device that is gone or
    /// no longer the datapath's).
    pub fn unpin_links(&self, roles: &[LinkRole], name: &str) -> Result<()> {
        for role in roles {
            remove_if_there(&self.link_path(*role, name))?;
        }
        Ok(())
    }

    /// Unpins the links of the pod behind host veth `host_veth` (DEL).
    pub fn unpin_pod_links(&self, host_veth: &str) -> Result<()> {
        for role in POD_ROLES {
            remove_if_there(&self.link_path(role, host_veth))?;
        }
        Ok(())
    }

    /// Unpins every host-veth link whose device is gone (GC, a DEL whose
    /// veth someone else removed): its pin only holds a dead link.
    pub fn prune_links(&self) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(self.links_dir()) else {
            return Ok(());
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let device = POD_ROLES
                .iter()
                .find_map(|role| name.strip_prefix(role.prefix())?.strip_prefix('-'));
            // Asked of this network namespace (an ioctl on a socket), not
            // of /sys/class/net: a runtime's mount namespace may hold a
            // sysfs of another network namespace, which would make every
            // live device look gone.
            if let Some(device) = device
                && nix::net::if_::if_nametoindex(device) == Err(nix::errno::Errno::ENODEV)
            {
                remove_if_there(&entry.path())?;
            }
        }
        Ok(())
    }
}

/// Pins `link` at `path` (its directory made first).
pub(super) fn pin_link(link: FdLink, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    link.pin(path)
        .map(drop)
        .map_err(|e| link_err(format!("pinning {}", path.display()), e))
}

pub(super) fn remove_if_there(path: &Path) -> Result<()> {
    crate::util::remove_file_if_present(path)
        .map(drop)
        .map_err(|e| Error::io(format!("unpinning {}", path.display()), e))
}

/// Takes a netlink-attached XDP program off `ifname`.
fn detach_netlink_xdp(ifname: &str) -> Result<()> {
    let status = std::process::Command::new("ip")
        .args(["link", "set", "dev", ifname, "xdp", "off"])
        .status()
        .map_err(|e| Error::io("running ip link set xdp off", e))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::kernel(
            format!("taking the old XDP program off {ifname}"),
            "ip link set xdp off failed",
        ))
    }
}

/// The programs at ingress of device `ifname` (index `index`), by ID and
/// name: its tcx programs and its cls_bpf filters (either way of attaching,
/// or both while a node is being moved to tcx).
pub async fn ingress_programs(
    host: &Netlink,
    index: u32,
    ifname: &str,
) -> Result<Vec<(u32, String)>> {
    hook_programs(host, index, ifname, TcHook::Ingress).await
}

/// The programs at `hook` of device `ifname` (index `index`), as
/// `ingress_programs` finds them.
pub async fn hook_programs(
    host: &Netlink,
    index: u32,
    ifname: &str,
    hook: TcHook,
) -> Result<Vec<(u32, String)>> {
    let attach_type = match hook {
        TcHook::Ingress => TcAttachType::Ingress,
        TcHook::Egress => TcAttachType::Egress,
    };
    let tcx = || {
        let mut found = Vec::new();
        if attach_mode() == AttachMode::Tcx
            && let Ok((_, programs)) = SchedClassifier::query_tcx(ifname, attach_type)
        {
            for info in programs {
                let name = info.name_as_str().unwrap_or_default().to_string();
                found.push((info.id(), name));
            }
        }
        found
    };
    in_move_order(host.tc_programs(index, hook), tcx).await
}

/// Programs as `filters` and `tcx` read them, filters first. A move to tcx
/// (`host_veth::move_to_tcx`, after ADD's answer) makes the link before it
/// takes the filter off: read the other way round, the two reads can fall
/// on either side of the move and find neither (CHECK, run while the move
/// was late on a loaded node, once said `attached: []`). In this order a
/// filter gone before the first read means the link was there before the
/// second. Listed tcx first, as they run first.
async fn in_move_order(
    filters: impl std::future::Future<Output = Result<Vec<(u32, String)>>>,
    tcx: impl FnOnce() -> Vec<(u32, String)>,
) -> Result<Vec<(u32, String)>> {
    let filters = filters.await?;
    let mut found = tcx();
    found.extend(filters);
    Ok(found)
}

#[cfg(test)]
mod move_order_tests {
    use std::cell::Cell;
    use std::future::Future;

    use super::*;

    /// A veth whose program moves from its filter to its tcx link right
    /// after the first of the two reads, whichever it is.
    struct Moving {
        moved: Cell<bool>,
    }

    impl Moving {
        fn filters(&self) -> Vec<(u32, String)> {
            let found = if self.moved.get() {
                vec![]
            } else {
                vec![(7, "from_pod".into())]
            };
            self.moved.set(true);
            found
        }

        fn tcx(&self) -> Vec<(u32, String)> {
            let found = if self.moved.get() {
                vec![(7, "from_pod".into())]
            } else {
                vec![]
            };
            self.moved.set(true);
            found
        }
    }

    #[test]
    fn a_move_between_the_two_reads_never_hides_the_program() {
        use std::task::{Context, Poll, Waker};
        let veth = Moving {
            moved: Cell::new(false),
        };
        let read = std::pin::pin!(in_move_order(async { Ok(veth.filters()) }, || veth.tcx()));
        // Nothing in it waits: one poll finishes it.
        let Poll::Ready(found) = read.poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("the reads waited");
        };
        let found = found.unwrap();
        assert!(found.iter().any(|(id, _)| *id == 7), "{found:?}");
    }
}

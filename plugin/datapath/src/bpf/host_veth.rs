//! The programs of a pod's host veth: put on (`from_pod`, or `from_pod_xdp`
//! with `from_pod_passed` at tc behind it, at ingress; `to_pod` at egress)
//! ADD's quick way (cls_bpf filters) and moved to tcx links after the
//! answer; and the pod side's XDP setup.

use std::fs::File;

use flatnet_common::{
    PROG_FROM_POD, PROG_FROM_POD_PASSED, PROG_FROM_POD_XDP, PROG_POD_XDP_PASS, PROG_TO_POD,
};

use super::attach::{AttachMode, LinkRole, attach_mode};
use super::{Datapath, TC_HANDLE, TC_PRIORITY};
use crate::DatapathMode;
use crate::error::Result;
use crate::netlink::{Netlink, TcHook, set_tx_checksum};
use crate::netns;

/// Puts this build's host-side programs on a pod's host veth `ifname`
/// (index `index`), replacing older ones atomically: `from_pod` (tc) or
/// `from_pod_xdp` (XDP, `from_pod_passed` at tc ingress behind it) at
/// ingress, `to_pod` at egress; tcx links (a node attached the old way
/// moved over, see `move_to_tcx`), cls_bpf filters where tcx is missing,
/// an XDP link.
pub async fn attach_host_veth(
    datapath: &Datapath,
    mode: DatapathMode,
    host: &Netlink,
    index: u32,
    ifname: &str,
) -> Result<()> {
    match (mode, attach_mode()) {
        (DatapathMode::Tc, AttachMode::Tcx) => move_to_tcx(datapath, host, index, ifname).await,
        (DatapathMode::Tc, AttachMode::Netlink) => attach_filter(datapath, host, index).await,
        (DatapathMode::Xdp, _) => {
            datapath.attach_xdp_link(PROG_FROM_POD_XDP, LinkRole::HostVeth, ifname, ifname)?;
            move_xdp_mode_to_tcx(datapath, host, index, ifname).await
        }
    }
}

/// XDP mode's quick way onto a new veth (ADD): `from_pod_xdp` through its
/// XDP link, `from_pod_passed` and `to_pod` as cls_bpf filters (see
/// `attach_filter`), moved to tcx links after the answer
/// (`move_xdp_mode_to_tcx`).
pub async fn attach_xdp_then_filter(
    datapath: &Datapath,
    host: &Netlink,
    index: u32,
    ifname: &str,
) -> Result<()> {
    datapath.attach_xdp_link(PROG_FROM_POD_XDP, LinkRole::HostVeth, ifname, ifname)?;
    attach_xdp_mode_filters(datapath, host, index).await
}

/// XDP mode's tc programs as cls_bpf filters on host veth `index`:
/// `from_pod_passed` at ingress, `to_pod` at egress.
async fn attach_xdp_mode_filters(datapath: &Datapath, host: &Netlink, index: u32) -> Result<()> {
    host.add_clsact(index).await?;
    set_filter(datapath, host, index, TcHook::Ingress, PROG_FROM_POD_PASSED).await?;
    set_filter(datapath, host, index, TcHook::Egress, PROG_TO_POD).await
}

/// `from_pod` and `to_pod` as direct-action cls_bpf filters at their fixed
/// priority and handle on host veth `index` (clsact added first), created
/// or replaced in place: the way without tcx, and ADD's quick way onto a
/// new veth (creating a tcx link waits for an RCU grace period in the
/// kernel, ~10 ms on the test VM, three times the rest of an ADD; the move
/// to tcx happens after the answer, see `after_answer`). `to_pod` is there
/// from the first packet: what the stack delivers into the pod is judged
/// by its policy and tells the fast path the stack carries that flow.
pub async fn attach_filter(datapath: &Datapath, host: &Netlink, index: u32) -> Result<()> {
    host.add_clsact(index).await?;
    set_filter(datapath, host, index, TcHook::Ingress, PROG_FROM_POD).await?;
    set_filter(datapath, host, index, TcHook::Egress, PROG_TO_POD).await
}

/// `to_pod` as a cls_bpf filter at tc egress of host veth `index`.
async fn attach_to_pod_filter(datapath: &Datapath, host: &Netlink, index: u32) -> Result<()> {
    host.add_clsact(index).await?;
    set_filter(datapath, host, index, TcHook::Egress, PROG_TO_POD).await
}

/// `program` as flatnet's cls_bpf filter at `hook` of `index` (its clsact
/// qdisc already there).
async fn set_filter(
    datapath: &Datapath,
    host: &Netlink,
    index: u32,
    hook: TcHook,
    program: &str,
) -> Result<()> {
    // Held until the filter is set: its fd is what netlink is handed.
    let pinned = datapath.program(program)?;
    host.set_tc_bpf(
        hook,
        index,
        pinned.raw_fd()?,
        program,
        TC_PRIORITY,
        TC_HANDLE,
    )
    .await
}

/// Moves host veth `ifname` (`index`) onto pinned tcx links of this
/// build's `from_pod` and `to_pod`: the links first (a frame meanwhile
/// meets the link's program, whose "next" would run the filter's copy
/// after it: the same verdict), then the cls_bpf filters off, then the
/// clsact qdisc if nothing else uses it. Idempotent: a veth already on its
/// links gets the programs updated in place.
pub async fn move_to_tcx(
    datapath: &Datapath,
    host: &Netlink,
    index: u32,
    ifname: &str,
) -> Result<()> {
    datapath.attach_tc_link(PROG_FROM_POD, LinkRole::HostVeth, ifname)?;
    crate::trace::mark("tcx link pinned");
    // A veth of a node that ran XDP mode before: `from_pod` does the work.
    datapath.unpin_links(&[LinkRole::Passed], ifname)?;
    host.remove_tc_bpf(TcHook::Ingress, index, TC_PRIORITY, TC_HANDLE)
        .await?;
    move_to_pod_to_tcx(datapath, host, index, ifname).await
}

/// XDP mode's tc programs onto their tcx links: `from_pod_passed` at
/// ingress, its cls_bpf filter off after, then `to_pod`
/// (`move_to_pod_to_tcx`). Idempotent; without tcx the filters stay.
pub async fn move_xdp_mode_to_tcx(
    datapath: &Datapath,
    host: &Netlink,
    index: u32,
    ifname: &str,
) -> Result<()> {
    if attach_mode() != AttachMode::Tcx {
        return attach_xdp_mode_filters(datapath, host, index).await;
    }
    datapath.attach_tc_link(PROG_FROM_POD_PASSED, LinkRole::Passed, ifname)?;
    host.remove_tc_bpf(TcHook::Ingress, index, TC_PRIORITY, TC_HANDLE)
        .await?;
    move_to_pod_to_tcx(datapath, host, index, ifname).await
}

/// `to_pod` alone onto its tcx link (the second half of `move_to_tcx` and
/// of `move_xdp_mode_to_tcx`), its cls_bpf filter off after. Without tcx
/// the filter stays. The clsact qdisc stays too, empty: deleting a qdisc
/// deactivates the device (`qdisc_graft` -> `dev_deactivate`, ingress and
/// clsact included), and until it is active again its transmit queue is
/// the noop qdisc, which drops whatever the stack sends into the pod
/// meanwhile (`QDISC_DROP`). The fast path's redirects never meet that
/// queue; UDP from another node, which its stack forwards, does: one
/// datagram lost in the IPv6 NodePort test, while the move ran late
/// under load (`tcx_move::moving_to_tcx_drops_nothing_the_stack_sends_into_the_pod`).
async fn move_to_pod_to_tcx(
    datapath: &Datapath,
    host: &Netlink,
    index: u32,
    ifname: &str,
) -> Result<()> {
    if attach_mode() != AttachMode::Tcx {
        return attach_to_pod_filter(datapath, host, index).await;
    }
    datapath.update_to_pod_link(ifname)?;
    host.remove_tc_bpf(TcHook::Egress, index, TC_PRIORITY, TC_HANDLE)
        .await
}

/// XDP mode only, for a new pod: its interface `ifname` (in namespace
/// `netns`) runs `pod_xdp_pass` through a pinned XDP link, as a veth
/// accepts XDP-redirected frames only with its NAPI on, which an attached
/// program turns on; and transmit checksum offload goes off on both ends,
/// because a frame entering XDP must have its checksums complete (see
/// `set_tx_checksum`).
pub fn prepare_pod_for_xdp(
    datapath: &Datapath,
    netns: &File,
    ifname: &str,
    host_veth: &str,
) -> Result<()> {
    netns::within(netns, || {
        datapath.attach_xdp_link(PROG_POD_XDP_PASS, LinkRole::PodSide, host_veth, ifname)
    })??;
    set_tx_checksum(host_veth, false)?;
    netns::within(netns, || set_tx_checksum(ifname, false))?
}

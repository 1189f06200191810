//! Which program goes where: this build's program on a pod's host veth
//! (tc ingress with the pod's counter slot as classid, or XDP), and what a
//! pod needs for XDP mode. The netlink requests are `crate::net`'s.

use std::fs::File;

use super::*;
use crate::net::{Netlink, set_tx_checksum};
use crate::netns;

/// Puts this build's host-side program on a pod's host veth, replacing an
/// older one atomically (tc: same filter priority/handle; XDP: same slot).
/// tc carries the pod's counter slot as the filter's classid.
pub async fn attach_host_veth(
    datapath: &Datapath,
    mode: DatapathMode,
    host: &Netlink,
    index: u32,
    counter_slot: u32,
) -> Result<()> {
    match mode {
        DatapathMode::Tc => {
            host.add_clsact(index).await?;
            let program = datapath.program(PROG_FROM_POD)?;
            host.set_tc_ingress_bpf(
                index,
                program.raw_fd()?,
                PROG_FROM_POD,
                TC_PRIORITY,
                TC_HANDLE,
                counter_slot,
            )
            .await
        }
        DatapathMode::Xdp => {
            host.set_xdp(index, datapath.program(PROG_FROM_POD_XDP)?.raw_fd()?)
                .await
        }
    }
}

/// XDP mode only, for a new pod: its interface `ifname` (index `pod_index`
/// in namespace `netns`, reached through `pod`) runs `pod_xdp_pass`, as a
/// veth accepts XDP-redirected frames only with its NAPI on, which an
/// attached program turns on; and transmit checksum offload goes off on
/// both ends, because a frame entering XDP must have its checksums
/// complete (see `set_tx_checksum`).
pub async fn prepare_pod_for_xdp(
    datapath: &Datapath,
    pod: &Netlink,
    pod_index: u32,
    netns: &File,
    ifname: &str,
    host_veth: &str,
) -> Result<()> {
    pod.set_xdp(pod_index, datapath.program(PROG_POD_XDP_PASS)?.raw_fd()?)
        .await?;
    set_tx_checksum(host_veth, false)?;
    netns::within(netns, || set_tx_checksum(ifname, false))?
}

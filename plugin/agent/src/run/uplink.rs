//! `from_uplink` and `to_uplink` on the node's uplink.

use flatnet_common::{PROG_FROM_UPLINK, PROG_TO_UPLINK};

use crate::error::{AgentError, Result};
use crate::node_state::{UPLINK_TC_HANDLE, UPLINK_TC_PRIORITY};
use crate::peers::Node;
use flatnet_datapath::bpf::{AttachMode, LinkRole, attach_mode, ingress_programs};
use flatnet_datapath::netlink::TcHook;

use super::Agent;

impl Agent {
    /// The uplink's ifindex: `--uplink`, else the interface holding the
    /// node's first address.
    pub(super) async fn uplink(&self, me: &Node) -> Result<u32> {
        if let Some(name) = &self.args.uplink {
            return self
                .host
                .link_by_name(name)
                .await?
                .map(|link| link.index)
                .ok_or_else(|| AgentError::Config(format!("--uplink {name}: no such interface")));
        }
        for address in &me.addresses {
            if let Some(index) = self.routes.interface_with(*address).await? {
                return Ok(index);
            }
        }
        Err(AgentError::Config(format!(
            "no interface holds any of node {}'s addresses {:?}: pass --uplink",
            me.name, me.addresses
        )))
    }

    /// Puts this build's `from_uplink` at tc ingress of the uplink unless it
    /// is there already: a pinned tcx link (a filter of an older agent taken
    /// off once the link is there), or, without tcx, a cls_bpf filter of its
    /// own priority/handle (create-or-replace: no packet misses a program).
    /// With tcx, `to_uplink` goes at its egress too (`UDP_FLOWS` in the
    /// eBPF crate's flow.rs relies on it; without tcx the datapath does not
    /// keep UDP answers, so it needs none).
    pub(super) async fn attach_uplink(&self, index: u32) -> Result<()> {
        let program = self.datapath.program(PROG_FROM_UPLINK)?;
        let id = program.id()?;
        let name = self
            .host
            .link_by_index(index)
            .await?
            .map(|link| link.name)
            .ok_or_else(|| AgentError::Config(format!("the uplink #{index} is gone")))?;
        // In place when this build's program is on the hook the way this
        // kernel attaches (tcx: through the pinned link, no filter of an
        // older agent left).
        let filters = self.host.tc_ingress_programs(index).await?;
        let in_place = match attach_mode() {
            AttachMode::Tcx => {
                filters.iter().all(|(_, n)| n != PROG_FROM_UPLINK)
                    && self.datapath.link_path(LinkRole::Uplink, &name).exists()
                    && self
                        .datapath
                        .link_path(LinkRole::UplinkEgress, &name)
                        .exists()
                    && ingress_programs(&self.host, index, &name)
                        .await?
                        .iter()
                        .any(|(prog, _)| *prog == id)
            }
            AttachMode::Netlink => filters
                .iter()
                .any(|(prog, n)| *prog == id && n == PROG_FROM_UPLINK),
        };
        if in_place {
            return Ok(());
        }
        match attach_mode() {
            AttachMode::Tcx => {
                self.datapath
                    .attach_tc_link(PROG_FROM_UPLINK, LinkRole::Uplink, &name)?;
                self.datapath
                    .attach_tc_link(PROG_TO_UPLINK, LinkRole::UplinkEgress, &name)?;
                self.host
                    .remove_tc_bpf(TcHook::Ingress, index, UPLINK_TC_PRIORITY, UPLINK_TC_HANDLE)
                    .await?;
            }
            AttachMode::Netlink => {
                self.host.add_clsact(index).await?;
                self.host
                    .set_tc_bpf(
                        TcHook::Ingress,
                        index,
                        program.raw_fd()?,
                        PROG_FROM_UPLINK,
                        UPLINK_TC_PRIORITY,
                        UPLINK_TC_HANDLE,
                    )
                    .await?;
            }
        }
        tracing::info!(
            ifindex = index,
            program_id = id,
            attachment = attach_mode().describe(),
            "from_uplink attached to the uplink"
        );
        Ok(())
    }
}

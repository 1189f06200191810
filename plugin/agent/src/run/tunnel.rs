//! `--routing`: what decides each peer's carrier (this node's connected
//! subnets), the VXLAN device tunnelled routes go through, and the pods'
//! MTU under encapsulation.

use std::net::IpAddr;

use flatnet_common::{PROG_FROM_TUNNEL, PROG_TO_UPLINK, TunnelConfig};

use crate::error::{AgentError, Result};
use crate::peers::carrier::{VXLAN_DEVICE, vtep_mac, vxlan_overhead};
use crate::peers::tunnel::Tunnel;
use crate::peers::{Node, Plan, Routing, RoutingMode};
use flatnet_datapath::bpf::{AttachMode, LinkRole, attach_mode, ingress_programs};
use flatnet_datapath::netlink::VxlanDevice;

/// The links of the VXLAN device's programs.
const TUNNEL_ROLES: [LinkRole; 2] = [LinkRole::Tunnel, LinkRole::TunnelEgress];

use super::Agent;

impl Agent {
    /// How peers are reached from here: the mode, and for `auto` the
    /// subnets this node is on now (read at each pass: an address may
    /// change).
    pub(super) async fn routing(&self) -> Result<Routing> {
        let connected = match self.args.routing {
            RoutingMode::Auto => self.routes.connected_subnets().await?,
            RoutingMode::Direct | RoutingMode::Vxlan => Vec::new(),
        };
        Ok(Routing {
            mode: self.args.routing,
            connected,
        })
    }

    /// The VXLAN device, made or corrected, when `--routing` may tunnel,
    /// with the datapath's programs on it; None with `direct` (a device of
    /// ours left from another setting is removed, with the routes and
    /// neighbours on it, and the datapath forgets it).
    pub(super) async fn ensure_tunnel(&self, plan: &Plan) -> Result<Option<Tunnel>> {
        if self.args.routing == RoutingMode::Direct {
            self.datapath.set_tunnel(None)?;
            self.datapath.unpin_links(&TUNNEL_ROLES, VXLAN_DEVICE)?;
            if let Some(link) = self.host.link_by_name(VXLAN_DEVICE).await? {
                self.host.delete_link(link.index).await?;
                tracing::info!(
                    device = VXLAN_DEVICE,
                    "VXLAN device removed (--routing direct)"
                );
            }
            return Ok(None);
        }
        let me = plan.me.as_ref().ok_or_else(|| {
            AgentError::Config(format!(
                "node {} is not in the node list: no address for its VXLAN device",
                self.node_name
            ))
        })?;
        let endpoint = tunnel_endpoint(me)?;
        let uplink = self.uplink(me).await?;
        let uplink_mtu = self.uplink_mtu(uplink).await?;
        let mac = vtep_mac(endpoint);
        let index = self
            .host
            .ensure_vxlan_device(&VxlanDevice {
                name: VXLAN_DEVICE,
                port: self.args.vxlan_port,
                mac,
                mtu: uplink_mtu.saturating_sub(vxlan_overhead(endpoint.is_ipv6())),
            })
            .await?;
        let tunnel = Tunnel {
            index,
            vni: self.args.vxlan_vni,
        };
        if let Err(e) = self.attach_tunnel(&tunnel, mac).await {
            // The stack's encap routes still carry every tunnelled packet.
            tracing::warn!(error = %e, "from_tunnel not attached: the stack carries tunnelled pods' packets");
            self.datapath.set_tunnel(None)?;
        }
        Ok(Some(tunnel))
    }

    /// `from_tunnel` at the VXLAN device's ingress and `to_uplink` at its
    /// egress (tcx links), then the datapath told where the device is, so
    /// `from_pod` encapsulates only into a device whose replies it sees.
    /// Without tcx the datapath leaves tunnelled CIDRs to the stack's
    /// routes (`to_uplink` could not see what the stack sends there).
    async fn attach_tunnel(&self, tunnel: &Tunnel, mac: [u8; 6]) -> Result<()> {
        if attach_mode() != AttachMode::Tcx {
            self.datapath.set_tunnel(None)?;
            return Ok(());
        }
        let id = self.datapath.program(PROG_FROM_TUNNEL)?.id()?;
        let in_place = TUNNEL_ROLES
            .iter()
            .all(|role| self.datapath.link_path(*role, VXLAN_DEVICE).exists())
            && ingress_programs(&self.host, tunnel.index, VXLAN_DEVICE)
                .await?
                .iter()
                .any(|(prog, _)| *prog == id);
        if !in_place {
            self.datapath
                .attach_tc_link(PROG_FROM_TUNNEL, LinkRole::Tunnel, VXLAN_DEVICE)?;
            self.datapath
                .attach_tc_link(PROG_TO_UPLINK, LinkRole::TunnelEgress, VXLAN_DEVICE)?;
            tracing::info!(
                device = VXLAN_DEVICE,
                program_id = id,
                "from_tunnel attached to the VXLAN device"
            );
        }
        self.datapath.set_tunnel(Some(TunnelConfig {
            ifindex: tunnel.index,
            vni: tunnel.vni,
            mac,
            _pad: [0; 2],
        }))?;
        Ok(())
    }

    /// The uplink's MTU (1500 when the kernel does not say).
    pub(super) async fn uplink_mtu(&self, uplink: u32) -> Result<u32> {
        Ok(self
            .host
            .link_by_index(uplink)
            .await?
            .and_then(|link| link.mtu)
            .unwrap_or(1500))
    }

    /// The largest GSO packet pods may send: what the uplink and (unless
    /// `--routing direct`) the VXLAN device take (`install::pods_gso_size`).
    pub(super) async fn pods_gso_size(&self, uplink: u32) -> Result<Option<u32>> {
        let mut devices = Vec::new();
        if let Some(link) = self.host.link_by_index(uplink).await? {
            devices.push(link.gso);
        }
        if self.args.routing != RoutingMode::Direct
            && let Some(link) = self.host.link_by_name(VXLAN_DEVICE).await?
        {
            devices.push(link.gso);
        }
        Ok(crate::install::pods_gso_size(&devices))
    }

    /// The pods' MTU: `--mtu`, else the uplink's, less VXLAN's overhead
    /// unless `--routing direct` (with `auto`, any peer may be tunnelled).
    pub(super) fn pod_mtu(&self, uplink_mtu: u32, me: &Node) -> u32 {
        if let Some(mtu) = self.args.mtu {
            return mtu;
        }
        match (self.args.routing, tunnel_endpoint(me)) {
            (RoutingMode::Direct, _) | (_, Err(_)) => uplink_mtu,
            (_, Ok(endpoint)) => uplink_mtu.saturating_sub(vxlan_overhead(endpoint.is_ipv6())),
        }
    }
}

/// The address this node's tunnels end at: its preferred one, as peers
/// see it in the node list.
fn tunnel_endpoint(me: &Node) -> Result<IpAddr> {
    me.addresses.first().copied().ok_or_else(|| {
        AgentError::Config(format!(
            "node {} has no address to end VXLAN tunnels at",
            me.name
        ))
    })
}

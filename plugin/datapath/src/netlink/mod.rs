//! Kernel networking over rtnetlink, in the host or a pod's namespace: one
//! file per kernel object (links, addresses, routes, neighbours, the gateway
//! device, tc and XDP attachment), names and MACs derived from the
//! attachment, and the two non-netlink knobs flatnet turns (ethtool, sysctl).

use std::fs::File;

use futures::StreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;

use crate::error::{Error, Result};
use crate::netns;

mod addr;
mod ethtool;
mod gateway;
mod link;
mod names;
mod neigh;
mod route;
mod sysctl;
mod tc;
mod vxlan;

pub use ethtool::set_tx_checksum;
pub use gateway::gateway_alias;
pub use link::{GsoLimits, LinkState, VethPair, ifindex_is_gone, ifname_of};
pub use names::{AttachmentNames, Mac, format_mac, parse_mac};
pub use route::RouteState;
pub use sysctl::{Forwarding, IPV4_FORWARD, IPV6_FORWARD, read_sysctl, set_sysctl};
pub use tc::TcHook;
pub use vxlan::VxlanDevice;

const EEXIST: i32 = libc::EEXIST;
const ENODEV: i32 = libc::ENODEV;
const ENOENT: i32 = libc::ENOENT;
const EINVAL: i32 = libc::EINVAL;

pub use crate::error::errno;

fn kernel(context: impl Into<String>, err: rtnetlink::Error) -> Error {
    Error::netlink(context, err)
}

/// An rtnetlink connection bound to one network namespace.
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// A connection in the current thread's namespace (the host's, for the plugin).
    pub fn connect() -> Result<Self> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::io("opening a netlink socket", e))?;
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    /// A connection whose socket lives in `ns`: every request acts there.
    pub fn connect_in(ns: &File) -> Result<Self> {
        let (connection, handle, _) = netns::within(ns, rtnetlink::new_connection)?
            .map_err(|e| Error::io("opening a netlink socket in the container namespace", e))?;
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    /// Sends one request and waits for its acknowledgement.
    async fn acked(
        &self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> std::result::Result<(), rtnetlink::Error> {
        let mut request = NetlinkMessage::from(message);
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let mut responses = self.handle.clone().request(request)?;
        while let Some(response) = responses.next().await {
            if let NetlinkPayload::Error(err) = response.payload
                && err.code.is_some()
            {
                return Err(rtnetlink::Error::NetlinkError(err));
            }
        }
        Ok(())
    }
}

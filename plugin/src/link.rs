//! Kernel networking over rtnetlink: veth pairs, addresses, routes,
//! neighbours and the gateway device, in the host or a pod's namespace.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use futures::{StreamExt, TryStreamExt};
use ipnetwork::IpNetwork;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::address::AddressFlags;
use rtnetlink::packet_route::link::{
    InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkMessage, LinkXdp,
};
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use rtnetlink::packet_route::tc::{
    TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcOption,
};
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVeth, RouteMessageBuilder};
use sha2::{Digest, Sha256};

use crate::cni::error::{Error, Result};
use crate::netns;

pub type Mac = [u8; 6];

const EEXIST: i32 = libc::EEXIST;
const ENODEV: i32 = libc::ENODEV;
const ENOENT: i32 = libc::ENOENT;
const EINVAL: i32 = libc::EINVAL;

/// The errno of a failed netlink request, if it was one.
pub fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => msg.code.map(|code| -code.get()),
        _ => None,
    }
}

fn describe(err: &rtnetlink::Error) -> String {
    match errno(err) {
        Some(code) => std::io::Error::from_raw_os_error(code).to_string(),
        None => err.to_string(),
    }
}

fn kernel(context: impl Into<String>, err: rtnetlink::Error) -> Error {
    Error::kernel(context, describe(&err))
}

/// Names and MACs derived from (network, container ID, ifname): stable, so
/// DEL and CHECK find the attachment again without any stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentNames {
    /// Host-side veth: "fl" + 12 hex digits, 14 bytes (Linux allows 15).
    pub host_veth: String,
    pub host_mac: Mac,
    pub pod_mac: Mac,
}

impl AttachmentNames {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Self {
        let digest = Sha256::new()
            .chain_update(network)
            .chain_update([0])
            .chain_update(container_id)
            .chain_update([0])
            .chain_update(ifname)
            .finalize();
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        // Locally administered unicast MACs (0x02 first byte), distinct per side.
        let mut host_mac = [0x02, 0, 0, 0, 0, 0];
        host_mac[1..].copy_from_slice(&digest[6..11]);
        let mut pod_mac = [0x02, 0, 0, 0, 0, 0];
        pod_mac[1..].copy_from_slice(&digest[11..16]);
        if pod_mac == host_mac {
            pod_mac[5] ^= 1;
        }
        AttachmentNames {
            host_veth: format!("fl{hex}"),
            host_mac,
            pod_mac,
        }
    }
}

pub fn format_mac(mac: &Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn parse_mac(text: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// What CHECK and DEL need to know of an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub name: String,
    pub mac: Option<Mac>,
    pub mtu: Option<u32>,
    pub up: bool,
    /// ifalias: flatnet marks the gateway devices it owns with it.
    pub alias: Option<String>,
    /// ID of the XDP program attached, if any.
    pub xdp_prog_id: Option<u32>,
}

impl LinkState {
    fn from_message(msg: &LinkMessage) -> Self {
        let mut state = LinkState {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            alias: None,
            xdp_prog_id: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => state.name = name.clone(),
                LinkAttribute::Address(bytes) if bytes.len() == 6 => {
                    state.mac = bytes.as_slice().try_into().ok();
                }
                LinkAttribute::Mtu(mtu) => state.mtu = Some(*mtu),
                LinkAttribute::IfAlias(alias) => state.alias = Some(alias.clone()),
                LinkAttribute::Xdp(xdp) => {
                    for item in xdp {
                        if let LinkXdp::ProgId(id) = item {
                            state.xdp_prog_id = Some(*id).filter(|id| *id != 0);
                        }
                    }
                }
                _ => {}
            }
        }
        state
    }
}

/// A route as read back from the kernel (main table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteState {
    pub dst: IpNetwork,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
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

    pub async fn link_by_name(&self, name: &str) -> Result<Option<LinkState>> {
        let mut request = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match request.try_next().await {
            Ok(Some(msg)) => Ok(Some(LinkState::from_message(&msg))),
            Ok(None) => Ok(None),
            Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(None),
            Err(e) => Err(kernel(format!("looking up interface {name}"), e)),
        }
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<LinkState>> {
        let mut request = self.handle.link().get().match_index(index).execute();
        match request.try_next().await {
            Ok(Some(msg)) => Ok(Some(LinkState::from_message(&msg))),
            Ok(None) => Ok(None),
            Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(None),
            Err(e) => Err(kernel(format!("looking up interface #{index}"), e)),
        }
    }

    /// Creates a veth pair in one request: `host` here, `peer` already inside
    /// `peer_ns` under its final name, host end up, fixed MACs and MTU.
    pub async fn create_veth(
        &self,
        host: &str,
        host_mac: Mac,
        peer: &str,
        peer_mac: Mac,
        peer_ns: &File,
        mtu: Option<u32>,
    ) -> Result<()> {
        // The host end comes up with the request itself (a round trip fewer).
        // The peer cannot: the kernel configures it before the pair is
        // linked, and opening an unlinked veth fails with ENOTCONN.
        let mut peer_msg = LinkBuilder::new()
            .name(peer.to_string())
            .address(peer_mac.to_vec())
            .setns_by_fd(peer_ns.as_raw_fd());
        let mut host_msg = LinkVeth::new(host, peer).address(host_mac.to_vec()).up();
        if let Some(mtu) = mtu {
            peer_msg = peer_msg.mtu(mtu);
            host_msg = host_msg.mtu(mtu);
        }
        let message = host_msg
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg.build())))
            .build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(|e| match errno(&e) {
                Some(EEXIST) => Error::kernel(
                    format!("creating veth {host} <-> {peer}"),
                    format!(
                        "an interface named {host} (host) or {peer} (container) already exists"
                    ),
                ),
                _ => kernel(format!("creating veth {host} <-> {peer}"), e),
            })
    }

    pub async fn set_up(&self, index: u32) -> Result<()> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(|e| kernel(format!("bringing interface #{index} up"), e))
    }

    /// Deletes a link; a link that is already gone is not an error.
    pub async fn delete_link(&self, index: u32) -> Result<()> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(()),
            Err(e) => Err(kernel(format!("deleting interface #{index}"), e)),
        }
    }

    /// Adds an address; one that is already there is not an error. IPv6
    /// addresses skip duplicate address detection: the address is ours (IPAM
    /// says so) and must be usable the moment ADD returns.
    pub async fn add_address(&self, index: u32, address: IpNetwork) -> Result<()> {
        let mut request = self
            .handle
            .address()
            .add(index, address.ip(), address.prefix());
        if address.is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match request.execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(kernel(
                format!("adding address {address} to interface #{index}"),
                e,
            )),
        }
    }

    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut found = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| kernel("listing addresses", e))?
        {
            for attr in &msg.attributes {
                if let AddressAttribute::Address(ip) = attr
                    && let Ok(net) = IpNetwork::new(*ip, msg.header.prefix_len)
                {
                    found.push(net);
                }
            }
        }
        Ok(found)
    }

    /// Adds (or replaces) the route `dst [via gw] dev oif [src]`; `scope_link`
    /// for routes without a gateway.
    pub async fn add_route(
        &self,
        dst: IpNetwork,
        gateway: Option<IpAddr>,
        oif: u32,
        pref_src: Option<IpAddr>,
    ) -> Result<()> {
        let context = || {
            let via = gateway.map(|gw| format!(" via {gw}")).unwrap_or_default();
            format!("adding route {dst}{via} dev #{oif}")
        };
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.network(), dst.prefix())
            .map_err(|e| Error::kernel(context(), e))?
            .output_interface(oif);
        if let Some(gw) = gateway {
            builder = builder
                .gateway(gw)
                .map_err(|e| Error::kernel(context(), e))?;
        } else {
            builder = builder.scope(RouteScope::Link);
        }
        if let Some(src) = pref_src {
            builder = builder
                .pref_source(src)
                .map_err(|e| Error::kernel(context(), e))?;
        }
        // Replace: a route to this address left on a downed veth (an IPv6
        // route outlives "down" until the reaper deletes the link) must give
        // way to the new pod's.
        match self
            .handle
            .route()
            .add(builder.build())
            .replace()
            .execute()
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(kernel(context(), e)),
        }
    }

    /// All main-table routes of one family.
    pub async fn routes(&self, family: AddressFamily) -> Result<Vec<RouteState>> {
        let mut query = RouteMessage::default();
        query.header.address_family = family;
        let mut stream = self.handle.route().get(query).execute();
        let mut found = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| kernel("listing routes", e))?
        {
            if msg.header.table != 254 {
                continue;
            }
            let mut dst_ip = None;
            let mut route = RouteState {
                dst: IpNetwork::new(IpAddr::from([0, 0, 0, 0]), 0)
                    .unwrap_or_else(|_| unreachable!()),
                gateway: None,
                oif: None,
            };
            for attr in &msg.attributes {
                match attr {
                    RouteAttribute::Destination(addr) => dst_ip = route_ip(addr),
                    RouteAttribute::Gateway(addr) => route.gateway = route_ip(addr),
                    RouteAttribute::Oif(index) => route.oif = Some(*index),
                    _ => {}
                }
            }
            let unspecified = if family == AddressFamily::Inet6 {
                IpAddr::from([0u16; 8])
            } else {
                IpAddr::from([0u8; 4])
            };
            if let Ok(dst) = IpNetwork::new(
                dst_ip.unwrap_or(unspecified),
                msg.header.destination_prefix_length,
            ) {
                route.dst = dst;
                found.push(route);
            }
        }
        Ok(found)
    }

    /// A permanent neighbour entry, so the host never ARPs for a pod.
    pub async fn add_permanent_neighbour(&self, index: u32, ip: IpAddr, mac: Mac) -> Result<()> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .map_err(|e| kernel(format!("adding neighbour {ip} on interface #{index}"), e))
    }

    /// The neighbour entries (address, MAC) on interface `index`.
    pub async fn neighbours(&self, index: u32) -> Result<Vec<(IpAddr, Mac)>> {
        let mut found = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut stream = self
                .handle
                .neighbours()
                .get()
                .set_address_family(family)
                .execute();
            while let Some(msg) = stream
                .try_next()
                .await
                .map_err(|e| kernel("listing neighbours", e))?
            {
                if msg.header.ifindex != index {
                    continue;
                }
                let mut ip = None;
                let mut mac = None;
                for attr in &msg.attributes {
                    match attr {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                            ip = Some(IpAddr::V4(*v4))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                            ip = Some(IpAddr::V6(*v6))
                        }
                        NeighbourAttribute::LinkLayerAddress(bytes) => {
                            mac = bytes.as_slice().try_into().ok()
                        }
                        _ => {}
                    }
                }
                if let (Some(ip), Some(mac)) = (ip, mac) {
                    found.push((ip, mac));
                }
            }
        }
        Ok(found)
    }

    /// Makes sure the gateway device `name` of `network` exists and is up;
    /// returns its index. It is a Linux bridge without ports (the dummy
    /// driver is not in every kernel): it only holds the gateway address, and
    /// no pod is ever attached to it. flatnet marks the devices it creates with the alias
    /// `flatnet:<network>` and refuses a device another network owns.
    pub async fn ensure_gateway_device(&self, name: &str, network: &str) -> Result<u32> {
        let owner = gateway_alias(network);
        if self.link_by_name(name).await?.is_none() {
            match self
                .handle
                .link()
                .add(
                    LinkBridge::new(name)
                        .multicast(false)
                        .mcast_snooping(false)
                        .build(),
                )
                .execute()
                .await
            {
                Ok(()) => {
                    // Created down and without multicast, so it never speaks: it
                    // only holds gateway addresses (no IPv6 autoconf, no IGMP reports
                    // for multicast snooping groups). Brought up below.
                    set_sysctl(&format!("net/ipv6/conf/{name}/disable_ipv6"), "1")?;
                    // The kernel ignores IFLA_IFALIAS when creating a link.
                    let index = self
                        .link_by_name(name)
                        .await?
                        .map(|link| link.index)
                        .unwrap_or_default();
                    self.handle
                        .link()
                        .set(
                            LinkUnspec::new_with_index(index)
                                .alias(owner.clone())
                                .build(),
                        )
                        .execute()
                        .await
                        .map_err(|e| {
                            kernel(format!("marking gateway device {name} as flatnet's"), e)
                        })?;
                }
                // Another ADD created it at the same moment and marks it.
                Err(e) if errno(&e) == Some(EEXIST) => {}
                Err(e) => return Err(kernel(format!("creating gateway device {name}"), e)),
            }
        }
        let link = self.link_by_name(name).await?.ok_or_else(|| {
            Error::kernel(
                format!("creating gateway device {name}"),
                "it vanished at once",
            )
        })?;
        if let Some(alias) = &link.alias
            && alias.starts_with(GATEWAY_ALIAS_PREFIX)
            && *alias != owner
        {
            return Err(Error::config(format!(
                "\"bridge\" {name} is already the gateway device of network {:?}; give this network its own \"bridge\" name",
                &alias[GATEWAY_ALIAS_PREFIX.len()..]
            )));
        }
        if !link.up {
            self.set_up(link.index).await?;
        }
        Ok(link.index)
    }

    /// Takes the gateway device flatnet created for `network` out of use:
    /// down, and renamed so no later ADD can find it; returns (index, new
    /// name) for the reaper, or None when there is nothing of ours to remove.
    pub async fn retire_gateway_device(
        &self,
        name: &str,
        network: &str,
    ) -> Result<Option<(u32, String)>> {
        match self.link_by_name(name).await? {
            Some(link) if link.alias.as_deref() == Some(gateway_alias(network).as_str()) => {
                let retired = format!("flgone{:x}", link.index);
                self.set_down(link.index).await?;
                self.rename(link.index, &retired).await?;
                Ok(Some((link.index, retired)))
            }
            _ => Ok(None),
        }
    }

    /// Link down: no packet crosses it any more (cheap, unlike a delete).
    pub async fn set_down(&self, index: u32) -> Result<()> {
        match self
            .handle
            .link()
            .set(LinkUnspec::new_with_index(index).down().build())
            .execute()
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(()),
            Err(e) => Err(kernel(format!("taking interface #{index} down"), e)),
        }
    }

    pub async fn rename(&self, index: u32, name: &str) -> Result<()> {
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(index)
                    .name(name.to_string())
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| kernel(format!("renaming interface #{index} to {name}"), e))
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

    /// Adds the clsact qdisc (tc's ingress and egress hooks) to `index`;
    /// one already there is fine.
    pub async fn add_clsact(&self, index: u32) -> Result<()> {
        /// TC_H_CLSACT and its qdisc handle (ffff:), from linux/pkt_sched.h.
        const TC_H_CLSACT: u32 = 0xffff_fff1;
        const CLSACT_HANDLE: u32 = 0xffff_0000;
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::from(TC_H_CLSACT);
        message.header.handle = TcHandle::from(CLSACT_HANDLE);
        message.attributes.push(TcAttribute::Kind("clsact".into()));
        match self
            .acked(
                RouteNetlinkMessage::NewQueueDiscipline(message),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(kernel(
                format!("adding the clsact qdisc to interface #{index}"),
                e,
            )),
        }
    }

    /// Puts BPF program `program_fd` (named `name`) at tc ingress of `index`
    /// as a direct-action filter with a fixed priority and handle, and
    /// `classid` for the program to read: created
    /// when absent, replaced in one atomic request when present (an upgrade).
    pub async fn set_tc_ingress_bpf(
        &self,
        index: u32,
        program_fd: std::os::fd::RawFd,
        name: &str,
        priority: u16,
        handle: u32,
        classid: u32,
    ) -> Result<()> {
        /// TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS) and htons(ETH_P_ALL).
        const CLSACT_INGRESS: u32 = 0xffff_fff2;
        const ALL_PROTOCOLS: u16 = 0x0003_u16.to_be();
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::from(CLSACT_INGRESS);
        message.header.handle = TcHandle::from(handle);
        message.header.info = (u32::from(priority) << 16) | u32::from(ALL_PROTOCOLS);
        message.attributes.push(TcAttribute::Kind("bpf".into()));
        message.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(program_fd as u32)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(name.into())),
            // Handed to the program as skb->tc_classid: per-veth data for free.
            TcOption::Bpf(TcFilterBpfOption::ClassId(TcHandle::from(classid))),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        ]));
        self.acked(
            RouteNetlinkMessage::NewTrafficFilter(message),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
        .map_err(|e| {
            kernel(
                format!("attaching {name} at tc ingress of interface #{index}"),
                e,
            )
        })
    }

    /// Attaches an XDP program (by fd) in driver mode through plain netlink,
    /// replacing one already there: unlike a bpf_link it outlives this
    /// process, and goes away with the device.
    pub async fn set_xdp(&self, index: u32, program_fd: std::os::fd::RawFd) -> Result<()> {
        /// XDP_FLAGS_DRV_MODE from linux/if_link.h.
        const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
        let message = LinkUnspec::new_with_index(index)
            .append_extra_attribute(LinkAttribute::Xdp(vec![
                LinkXdp::Fd(program_fd),
                LinkXdp::Flags(XDP_FLAGS_DRV_MODE),
            ]))
            .build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(|e| kernel(format!("attaching XDP to interface #{index}"), e))
    }

    /// IDs of the BPF programs attached as tc ingress filters on `index`.
    pub async fn tc_ingress_programs(&self, index: u32) -> Result<Vec<(u32, String)>> {
        let mut stream = self
            .handle
            .traffic_filter(index as i32)
            .get()
            .ingress()
            .execute();
        let mut found = Vec::new();
        loop {
            match stream.try_next().await {
                Ok(Some(msg)) => {
                    for attr in &msg.attributes {
                        let TcAttribute::Options(options) = attr else {
                            continue;
                        };
                        let mut id = None;
                        let mut name = String::new();
                        for option in options {
                            match option {
                                TcOption::Bpf(TcFilterBpfOption::ProgId(prog)) => id = Some(*prog),
                                TcOption::Bpf(TcFilterBpfOption::ProgName(prog)) => {
                                    name = prog.clone()
                                }
                                _ => {}
                            }
                        }
                        if let Some(id) = id {
                            found.push((id, name));
                        }
                    }
                }
                Ok(None) => break,
                // No clsact qdisc: nothing attached.
                Err(e) if matches!(errno(&e), Some(ENOENT) | Some(EINVAL)) => break,
                Err(e) => {
                    return Err(kernel(
                        format!("listing tc filters on interface #{index}"),
                        e,
                    ));
                }
            }
        }
        Ok(found)
    }
}

type LinkBuilder = rtnetlink::LinkMessageBuilder<LinkUnspec>;

const GATEWAY_ALIAS_PREFIX: &str = "flatnet:";

pub fn gateway_alias(network: &str) -> String {
    format!("{GATEWAY_ALIAS_PREFIX}{network}")
}

fn route_ip(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

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

/// Writes a sysctl under /proc/sys (of the current thread's namespace).
pub fn set_sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{key}");
    std::fs::write(&path, value).map_err(|e| Error::io(format!("writing {value} to {path}"), e))
}

/// True when no interface has this index in the current namespace.
pub fn ifindex_is_gone(index: u32) -> bool {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE bytes, as if_indextoname requires.
    let found = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
    found.is_null() && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_distinct() {
        let a = AttachmentNames::new("pods", "c1", "eth0");
        assert_eq!(a, AttachmentNames::new("pods", "c1", "eth0"));
        assert_eq!(a.host_veth.len(), 14);
        assert!(a.host_veth.starts_with("fl"));
        for other in [
            AttachmentNames::new("pods", "c1", "eth1"),
            AttachmentNames::new("pods", "c2", "eth0"),
            AttachmentNames::new("pods2", "c1", "eth0"),
            // The separator keeps ("ab","c") and ("a","bc") apart.
            AttachmentNames::new("pod", "sc1", "eth0"),
        ] {
            assert_ne!(a.host_veth, other.host_veth);
        }
        assert_ne!(a.host_mac, a.pod_mac);
        assert_eq!(a.host_mac[0] & 0x03, 0x02, "locally administered unicast");
        assert_eq!(a.pod_mac[0] & 0x03, 0x02);
    }

    #[test]
    fn macs_round_trip() {
        let mac = [0x02, 0xab, 0, 1, 0xff, 9];
        assert_eq!(format_mac(&mac), "02:ab:00:01:ff:09");
        assert_eq!(parse_mac("02:ab:00:01:ff:09"), Some(mac));
        assert_eq!(parse_mac("02:ab:00:01:ff"), None);
        assert_eq!(parse_mac("02:ab:00:01:ff:09:00"), None);
        assert_eq!(parse_mac("zz:ab:00:01:ff:09"), None);
    }
}

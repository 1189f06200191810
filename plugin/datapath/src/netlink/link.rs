//! Links: looking them up, the veth pair of a pod, up and down, renames,
//! deletion.

use futures::TryStreamExt;
use std::fs::File;
use std::os::fd::AsRawFd;

use rtnetlink::packet_route::link::{
    InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkMessage, LinkXdp,
};
use rtnetlink::{LinkUnspec, LinkVeth};

use super::names::Mac;
use super::{EEXIST, EINVAL, ENODEV, ENOENT, Netlink, errno, kernel};
use crate::error::{Error, Result};

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
    pub gso: GsoLimits,
}

/// A device's GSO/GRO limits (BIG TCP raises them above 64 KiB), as the
/// kernel reports them; None where it reports nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsoLimits {
    pub gso_max_size: Option<u32>,
    pub gro_max_size: Option<u32>,
    pub gso_ipv4_max_size: Option<u32>,
    pub gro_ipv4_max_size: Option<u32>,
    /// The most the device takes.
    pub tso_max_size: Option<u32>,
}

impl GsoLimits {
    /// The four limits, by name, for messages and tests.
    pub fn named(&self) -> [(&'static str, Option<u32>); 4] {
        [
            ("gso_max_size", self.gso_max_size),
            ("gro_max_size", self.gro_max_size),
            ("gso_ipv4_max_size", self.gso_ipv4_max_size),
            ("gro_ipv4_max_size", self.gro_ipv4_max_size),
        ]
    }
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
            gso: GsoLimits::default(),
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => state.name = name.clone(),
                LinkAttribute::Address(bytes) if bytes.len() == 6 => {
                    state.mac = bytes.as_slice().try_into().ok();
                }
                LinkAttribute::Mtu(mtu) => state.mtu = Some(*mtu),
                LinkAttribute::IfAlias(alias) => state.alias = Some(alias.clone()),
                LinkAttribute::GsoMaxSize(size) => state.gso.gso_max_size = Some(*size),
                LinkAttribute::GroMaxSize(size) => state.gso.gro_max_size = Some(*size),
                LinkAttribute::GsoIpv4MaxSize(size) => state.gso.gso_ipv4_max_size = Some(*size),
                LinkAttribute::GroIpv4MaxSize(size) => state.gso.gro_ipv4_max_size = Some(*size),
                LinkAttribute::TsoMaxSize(size) => state.gso.tso_max_size = Some(*size),
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

type LinkBuilder = rtnetlink::LinkMessageBuilder<LinkUnspec>;

/// A veth pair to make: the host end, and the peer, made in a namespace.
pub struct VethPair<'a> {
    pub host: &'a str,
    pub host_mac: Mac,
    pub peer: &'a str,
    pub peer_mac: Mac,
    pub mtu: Option<u32>,
    /// GSO/GRO size for both ends (BIG TCP), None for the defaults.
    pub big_tcp: Option<u32>,
}

impl Netlink {
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
    pub async fn create_veth(&self, pair: &VethPair<'_>, peer_ns: &File) -> Result<()> {
        // The host end comes up with the request itself (a round trip fewer).
        // The peer cannot: the kernel configures it before the pair is
        // linked, and opening an unlinked veth fails with ENOTCONN.
        // BIG TCP: both ends are made with their GSO/GRO limits raised, in
        // the same request.
        let message = |big_tcp: Option<u32>| {
            let mut peer_msg = LinkBuilder::new()
                .name(pair.peer.to_string())
                .address(pair.peer_mac.to_vec())
                .setns_by_fd(peer_ns.as_raw_fd());
            let mut host_msg = LinkVeth::new(pair.host, pair.peer)
                .address(pair.host_mac.to_vec())
                .up();
            if let Some(mtu) = pair.mtu {
                peer_msg = peer_msg.mtu(mtu);
                host_msg = host_msg.mtu(mtu);
            }
            for attribute in big_tcp.map(big_tcp_attributes).into_iter().flatten() {
                peer_msg = peer_msg.append_extra_attribute(attribute.clone());
                host_msg = host_msg.append_extra_attribute(attribute);
            }
            host_msg
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg.build())))
                .build()
        };
        let mut outcome = self
            .handle
            .link()
            .add(message(pair.big_tcp))
            .execute()
            .await;
        // A kernel without BIG TCP refuses the sizes: the 64 KiB defaults.
        if pair.big_tcp.is_some()
            && let Err(e) = &outcome
            && errno(e) == Some(EINVAL)
        {
            outcome = self.handle.link().add(message(None)).execute().await;
        }
        let (host, peer) = (pair.host, pair.peer);
        outcome.map_err(|e| match errno(&e) {
            Some(EEXIST) => Error::kernel(
                format!("creating veth {host} <-> {peer}"),
                format!("an interface named {host} (host) or {peer} (container) already exists"),
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

    /// Deletes a link; a link that is already gone is not an error.
    pub async fn delete_link(&self, index: u32) -> Result<()> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(()),
            Err(e) => Err(kernel(format!("deleting interface #{index}"), e)),
        }
    }
}

/// True when no interface has this index in the current namespace.
pub fn ifindex_is_gone(index: u32) -> bool {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE bytes, as if_indextoname requires.
    let found = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
    found.is_null() && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
}

/// The name of the device with index `index` in the calling thread's
/// namespace, if there is one.
pub fn ifname_of(index: u32) -> Option<String> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE bytes, as if_indextoname requires.
    let found = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
    if found.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// The link attributes that raise a device's GSO and GRO limits to `size`,
/// for IPv6 (and the generic limit) and for IPv4.
fn big_tcp_attributes(size: u32) -> [LinkAttribute; 4] {
    [
        LinkAttribute::GsoMaxSize(size),
        LinkAttribute::GroMaxSize(size),
        LinkAttribute::GsoIpv4MaxSize(size),
        LinkAttribute::GroIpv4MaxSize(size),
    ]
}

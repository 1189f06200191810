//! Links: looking them up, the veth pair of a pod, up and down, renames,
//! deletion.

use super::*;

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

type LinkBuilder = rtnetlink::LinkMessageBuilder<LinkUnspec>;

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

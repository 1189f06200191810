//! The nftables ruleset's generation: a number the kernel moves on with
//! every change to any table of the network namespace, whoever makes it
//! (`NFT_MSG_GETGEN` over nfnetlink). Reading it is one netlink round
//! trip; listing the no-masquerade sets of 5,000 nodes with `nft -j` took
//! 33 ms. The agent's periodic re-check lists its sets only when the
//! generation moved since it last found them right.

use netlink_packet_core::{
    Emitable, ErrorBuffer, NLM_F_REQUEST, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader, NlasIterator,
    parse_u32_be,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::error::{Error, Result};

/// nfnetlink's nftables subsystem, and its generation messages.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
/// The attribute holding the generation (big-endian u32).
const NFTA_GEN_ID: u16 = 1;
/// `struct nfgenmsg`, before the attributes.
const NFGENMSG: usize = 4;

/// The current network namespace's nftables generation.
pub fn nftables_generation() -> Result<u32> {
    let mut socket =
        Socket::new(NETLINK_NETFILTER).map_err(|e| Error::io("opening an nfnetlink socket", e))?;
    socket
        .bind_auto()
        .map_err(|e| Error::io("binding the nfnetlink socket", e))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| Error::io("connecting the nfnetlink socket", e))?;
    socket
        .send(&request(), 0)
        .map_err(|e| Error::io("asking nftables for its generation", e))?;
    let mut reply = Vec::with_capacity(4096);
    socket
        .recv(&mut reply, 0)
        .map_err(|e| Error::io("reading nftables' generation", e))?;
    generation_of(&reply).map_err(|reason| Error::kernel("nftables' generation", reason))
}

/// NFT_MSG_GETGEN: a header and an nfgenmsg (any family, version 0).
fn request() -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.length = (header.buffer_len() + NFGENMSG) as u32;
    header.message_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN;
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut message = vec![0u8; header.length as usize];
    header.emit(&mut message);
    message
}

/// The generation in the kernel's reply, or why there is none.
fn generation_of(reply: &[u8]) -> std::result::Result<u32, String> {
    let message = NetlinkBuffer::new_checked(reply).map_err(|e| e.to_string())?;
    let kind = message.message_type();
    if kind == NLMSG_ERROR {
        let error = ErrorBuffer::new_checked(message.payload()).map_err(|e| e.to_string())?;
        let errno = error.code().map_or(0, |code| -code.get());
        return Err(std::io::Error::from_raw_os_error(errno).to_string());
    }
    if kind != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
        return Err(format!("an unexpected reply (message type {kind:#x})"));
    }
    let attributes = message.payload().get(NFGENMSG..).unwrap_or_default();
    NlasIterator::new(attributes)
        .map_while(|attribute| attribute.ok())
        .find(|attribute| attribute.kind() == NFTA_GEN_ID)
        .and_then(|attribute| parse_u32_be(attribute.value()).ok())
        .ok_or_else(|| "no generation in the reply".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as the kernel writes it: NEWGEN, the generation, the pid and
    /// name of the process that made the last change.
    fn reply(generation: u32) -> Vec<u8> {
        let mut attributes = Vec::new();
        for (kind, value) in [
            (NFTA_GEN_ID, generation.to_be_bytes().to_vec()),
            (2, 4711u32.to_be_bytes().to_vec()),
            (3, b"nft\0".to_vec()),
        ] {
            attributes.extend(((4 + value.len()) as u16).to_ne_bytes());
            attributes.extend(kind.to_ne_bytes());
            attributes.extend(&value);
            attributes.resize(attributes.len().next_multiple_of(4), 0);
        }
        let length = 16 + NFGENMSG + attributes.len();
        let mut message = Vec::new();
        message.extend((length as u32).to_ne_bytes());
        message.extend(((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN).to_ne_bytes());
        message.extend([0u8; 10]);
        message.extend([0u8; NFGENMSG]);
        message.extend(attributes);
        message
    }

    #[test]
    fn the_generation_is_read_from_its_attribute() {
        assert_eq!(generation_of(&reply(0x0102_0304)), Ok(0x0102_0304));
    }

    #[test]
    fn a_refusal_or_a_short_reply_says_so() {
        // An error message: the errno, then the request it refuses.
        let length = 16 + 4 + 16;
        let mut refused = vec![0u8; length];
        refused[0..4].copy_from_slice(&(length as u32).to_ne_bytes());
        refused[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        refused[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        let said = generation_of(&refused).unwrap_err();
        assert!(said.contains("not permitted"), "{said}");
        assert!(generation_of(&reply(1)[..10]).is_err());
        let mut truncated = reply(1);
        truncated.truncate(16 + NFGENMSG);
        truncated[0..4].copy_from_slice(&((16 + NFGENMSG) as u32).to_ne_bytes());
        assert_eq!(
            generation_of(&truncated).unwrap_err(),
            "no generation in the reply"
        );
    }

    #[test]
    fn the_request_is_a_getgen_of_the_nftables_subsystem() {
        let request = request();
        assert_eq!(request[4..6], ((10u16 << 8) | 16).to_ne_bytes());
        assert_eq!(request.len(), 20);
    }
}

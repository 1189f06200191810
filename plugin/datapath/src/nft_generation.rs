//! The nftables ruleset's generation: a number the kernel moves on with
//! every change to any table of the network namespace, whoever makes it
//! (`NFT_MSG_GETGEN` over nfnetlink). Reading it is one netlink round
//! trip; listing the no-masquerade sets of 5,000 nodes with `nft -j` took
//! 33 ms. The agent's periodic re-check lists its sets only when the
//! generation moved since it last found them right.

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::error::{Error, Result};

/// nfnetlink's nftables subsystem, and its generation messages.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
/// The attribute holding the generation (big-endian u32).
const NFTA_GEN_ID: u16 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
/// `struct nlmsghdr`, then `struct nfgenmsg`.
const HEADER: usize = 16;
const NFGENMSG: usize = 4;
/// An attribute's type without its nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

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
fn request() -> [u8; HEADER + NFGENMSG] {
    let mut message = [0u8; HEADER + NFGENMSG];
    message[0..4].copy_from_slice(&((HEADER + NFGENMSG) as u32).to_ne_bytes());
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN;
    message[4..6].copy_from_slice(&kind.to_ne_bytes());
    message[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    message[8..12].copy_from_slice(&1u32.to_ne_bytes());
    message
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

/// The generation in the kernel's reply, or why there is none.
fn generation_of(reply: &[u8]) -> std::result::Result<u32, String> {
    let length = reply
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or("a reply shorter than a netlink header")? as usize;
    let kind = u16_at(reply, 4).ok_or("a reply shorter than a netlink header")?;
    let message = reply.get(..length).ok_or("a reply shorter than it says")?;
    if kind == NLMSG_ERROR {
        let errno = message
            .get(HEADER..HEADER + 4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_ne_bytes)
            .unwrap_or_default();
        return Err(std::io::Error::from_raw_os_error(-errno).to_string());
    }
    if kind != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
        return Err(format!("an unexpected reply (message type {kind:#x})"));
    }
    let mut at = HEADER + NFGENMSG;
    while let (Some(size), Some(attribute)) = (u16_at(message, at), u16_at(message, at + 2)) {
        let size = usize::from(size);
        if size < 4 {
            break;
        }
        if attribute & NLA_TYPE_MASK == NFTA_GEN_ID
            && let Some(value) = message.get(at + 4..at + 8)
            && let Ok(value) = value.try_into()
        {
            return Ok(u32::from_be_bytes(value));
        }
        at += size.next_multiple_of(4);
    }
    Err("no generation in the reply".into())
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
        let length = HEADER + NFGENMSG + attributes.len();
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
        let mut refused = vec![0u8; HEADER + 4];
        refused[0..4].copy_from_slice(&((HEADER + 4) as u32).to_ne_bytes());
        refused[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        refused[HEADER..].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        let said = generation_of(&refused).unwrap_err();
        assert!(said.contains("not permitted"), "{said}");
        assert!(generation_of(&reply(1)[..10]).is_err());
        let mut truncated = reply(1);
        truncated.truncate(HEADER + NFGENMSG);
        truncated[0..4].copy_from_slice(&((HEADER + NFGENMSG) as u32).to_ne_bytes());
        assert_eq!(
            generation_of(&truncated).unwrap_err(),
            "no generation in the reply"
        );
    }

    #[test]
    fn the_request_is_a_getgen_of_the_nftables_subsystem() {
        let request = request();
        assert_eq!(u16_at(&request, 4), Some((10 << 8) | 16));
        assert_eq!(request.len(), 20);
    }
}

//! `FLOWS`: what the fast path keeps of the kernel's conntrack answers, one
//! entry per flow direction (see the eBPF crate's flow.rs for why a kept
//! answer stays true).

use std::net::{IpAddr, SocketAddr};

use flatnet_common::{FlowKey, FlowVerdict, MAP_FLOWS};

use flatnet_common::maps;

use super::Datapath;
use super::typed::HashOf;
use crate::error::{Error, Result};

/// The key of the flow direction whose packets go from `src` to `dst`
/// (`proto`: IPPROTO_TCP or IPPROTO_UDP), as the programs build it: IPv4
/// in the first 4 bytes of each address.
pub fn flow_key(src: SocketAddr, dst: SocketAddr, proto: u8) -> FlowKey {
    let bytes = |address: IpAddr| match address {
        IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    };
    FlowKey {
        src: bytes(src.ip()),
        dst: bytes(dst.ip()),
        sport: src.port().to_be_bytes(),
        dport: dst.port().to_be_bytes(),
        family: if src.is_ipv4() { 4 } else { 6 },
        proto,
        _pad: [0; 2],
    }
}

impl Datapath {
    fn flows(&self) -> Result<HashOf<maps::FLOWS>> {
        self.hash_map::<maps::FLOWS>()
    }

    /// The answer kept for `key` (`flatnet_common::verdict::*`), if any.
    pub fn flow_verdict(&self, key: &FlowKey) -> Result<Option<u32>> {
        match self.flows()?.get(key, 0) {
            Ok(value) => Ok(Some(value.verdict)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(Error::bpf(format!("reading {MAP_FLOWS}"), e)),
        }
    }

    /// Keeps `verdict` for `key` as a program would (an LRU: a full map
    /// forgets its least recently used entry).
    pub fn keep_flow(&self, key: &FlowKey, verdict: u32) -> Result<()> {
        let value = FlowVerdict { verdict, _pad: 0 };
        self.flows()?
            .insert(key, value, 0)
            .map_err(|e| Error::bpf(format!("writing {MAP_FLOWS}"), e))
    }

    /// How many flow directions have a kept answer.
    pub fn flow_count(&self) -> Result<usize> {
        Ok(self.flows()?.keys().filter(|key| key.is_ok()).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_built_as_the_programs_build_them() {
        let key = flow_key(
            "10.244.1.2:40000".parse().unwrap(),
            "10.244.1.3:53".parse().unwrap(),
            17,
        );
        assert_eq!(key.src[..4], [10, 244, 1, 2]);
        assert_eq!(key.src[4..], [0; 12]);
        assert_eq!(key.sport, [0x9c, 0x40]);
        assert_eq!(key.dport, [0, 53]);
        assert_eq!((key.family, key.proto), (4, 17));
        let v6 = flow_key(
            "[fd00::2]:1".parse().unwrap(),
            "[fd00::3]:2".parse().unwrap(),
            6,
        );
        assert_eq!((v6.family, v6.proto, v6.dst[15]), (6, 6, 3));
    }
}

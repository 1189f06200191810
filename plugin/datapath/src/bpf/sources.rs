//! `POD_SOURCES`: the addresses each pod may send from.

use std::net::IpAddr;

use flatnet_common::{
    MAP_POD_SOURCES, NO_COUNTER_SLOT, PodSources, SOURCES_F_MORE, SOURCES_F_VALID,
    SOURCES_PER_FAMILY, maps,
};

use super::Datapath;
use super::typed::ArrayOf;
use crate::error::{Error, Result};

impl Datapath {
    /// The addresses the address maps give the pod behind host veth `index`.
    pub(super) fn addresses_of(&self, index: u32) -> Result<Vec<IpAddr>> {
        Ok(self
            .all_endpoints()?
            .into_iter()
            .filter(|(_, endpoint)| endpoint.host_ifindex == index)
            .map(|(ip, _)| ip)
            .collect())
    }

    pub(super) fn pod_sources(&self) -> Result<ArrayOf<maps::POD_SOURCES>> {
        self.array::<maps::POD_SOURCES>()
    }

    /// Writes the addresses the pod in counter slot `slot`, behind host
    /// veth `ifindex`, may send from.
    pub(super) fn set_sources(
        &self,
        slot: u32,
        ifindex: u32,
        addresses: &[IpAddr],
        flags: u32,
    ) -> Result<()> {
        if slot == NO_COUNTER_SLOT {
            return Ok(());
        }
        let mut sources = sources_of(ifindex, addresses);
        sources.flags |= flags;
        self.pod_sources()?
            .set(slot, sources, 0)
            .map_err(|e| Error::bpf("writing a pod's source addresses", e))
    }

    /// The source addresses written for counter slot `slot`.
    pub fn sources(&self, slot: u32) -> Result<PodSources> {
        self.pod_sources()?
            .get(&slot, 0)
            .map_err(|e| Error::bpf("reading a pod's source addresses", e))
    }

    /// Empties a freed slot's source addresses.
    pub(super) fn clear_sources(&self, slot: u32) -> Result<()> {
        if slot == NO_COUNTER_SLOT || !self.map_path(MAP_POD_SOURCES).exists() {
            return Ok(());
        }
        self.pod_sources()?
            .set(slot, PodSources::default(), 0)
            .map_err(|e| Error::bpf("clearing a pod's source addresses", e))
    }

    /// Fills `POD_SOURCES` for every pod whose entry is not written yet (an
    /// upgrade from a build without the map), before the new programs are
    /// attached: they drop what they find neither there nor in the address
    /// maps. One pass over the maps, however many pods.
    pub(super) fn fill_missing_sources(&self) -> Result<()> {
        let veths = self.host_veths()?;
        if veths.is_empty() {
            return Ok(());
        }
        let sources = self.pod_sources()?;
        let endpoints = self.all_endpoints()?;
        for (index, endpoint) in veths {
            let slot = endpoint.counter_slot;
            if slot == NO_COUNTER_SLOT {
                continue;
            }
            let current = sources
                .get(&slot, 0)
                .map_err(|e| Error::bpf("reading a pod's source addresses", e))?;
            if current.flags & SOURCES_F_VALID != 0 {
                continue;
            }
            let addresses: Vec<IpAddr> = endpoints
                .iter()
                .filter(|(_, e)| e.host_ifindex == index)
                .map(|(ip, _)| *ip)
                .collect();
            self.set_sources(slot, index, &addresses, 0)?;
        }
        Ok(())
    }
}

/// The `POD_SOURCES` entry of the pod behind host veth `ifindex` with
/// `addresses`: up to `SOURCES_PER_FAMILY` per family, `SOURCES_F_MORE`
/// when it has more.
pub fn sources_of(ifindex: u32, addresses: &[IpAddr]) -> PodSources {
    let mut sources = PodSources {
        flags: SOURCES_F_VALID,
        host_ifindex: ifindex,
        ..PodSources::default()
    };
    let (mut v4, mut v6) = (0, 0);
    for address in addresses {
        match address {
            IpAddr::V4(ip) if v4 < SOURCES_PER_FAMILY => {
                sources.v4[v4] = ip.octets();
                v4 += 1;
            }
            IpAddr::V6(ip) if v6 < SOURCES_PER_FAMILY => {
                sources.v6[v6] = ip.octets();
                v6 += 1;
            }
            _ => sources.flags |= SOURCES_F_MORE,
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_hold_a_pods_addresses_and_say_when_there_are_more() {
        let ips: Vec<IpAddr> = ["10.1.0.5", "fd00::5", "10.2.0.5"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let sources = sources_of(7, &ips);
        assert_eq!(sources.flags, SOURCES_F_VALID);
        assert_eq!(sources.host_ifindex, 7);
        assert_eq!(sources.v4[..2], [[10, 1, 0, 5], [10, 2, 0, 5]]);
        assert_eq!(sources.v4[2], [0; 4]);
        assert_eq!(
            sources.v6[0],
            "fd00::5".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        let many: Vec<IpAddr> = (1..=5).map(|i| IpAddr::from([10, 0, 0, i])).collect();
        let sources = sources_of(7, &many);
        assert_eq!(sources.flags, SOURCES_F_VALID | SOURCES_F_MORE);
        assert_eq!(sources.v4[3], [10, 0, 0, 4]);
        assert_eq!(sources_of(7, &[]).flags, SOURCES_F_VALID);
    }
}

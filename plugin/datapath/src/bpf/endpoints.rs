//! The pods the datapath knows: their host veths and addresses.

use std::net::IpAddr;

use aya::maps::{HashMap, MapData};
use flatnet_common::{
    ENDPOINT_F_SHAPED_INGRESS, Endpoint, Ipv4Key, Ipv6Key, KeyOf, MAP_HOST_VETHS,
    SOURCES_F_SHAPED_EGRESS, TypedMap, maps,
};

use super::{Datapath, ignore_missing};
use crate::Shaping;
use crate::error::{Error, Result};

impl Datapath {
    /// Makes a pod known to the datapath: its host veth (with the counter
    /// slot claimed for it, zeroed then), then its addresses (last, so no
    /// packet is redirected to a half-known pod). `shaping`: what qdiscs on
    /// its host veth shape, which the fast path must then not skip.
    pub fn insert_pod(
        &self,
        mut endpoint: Endpoint,
        addresses: &[IpAddr],
        shaping: Shaping,
    ) -> Result<()> {
        let index = endpoint.host_ifindex;
        if shaping.ingress {
            endpoint.flags |= ENDPOINT_F_SHAPED_INGRESS;
        }
        let sources_flags = if shaping.egress {
            SOURCES_F_SHAPED_EGRESS
        } else {
            0
        };
        self.set_sources(endpoint.counter_slot, index, addresses, sources_flags)?;
        self.hash_map::<maps::HOST_VETHS>()?
            .insert(index, endpoint, 0)
            .map_err(|e| Error::bpf("inserting the host veth", e))?;
        for address in addresses {
            match address {
                IpAddr::V4(v4) => {
                    self.hash_map::<maps::ENDPOINTS_V4>()?
                        .insert(v4.octets(), endpoint, 0)
                }
                IpAddr::V6(v6) => {
                    self.hash_map::<maps::ENDPOINTS_V6>()?
                        .insert(v6.octets(), endpoint, 0)
                }
            }
            .map_err(|e| Error::bpf(format!("inserting endpoint {address}"), e))?;
        }
        Ok(())
    }

    /// The endpoint of an address, if the datapath knows it.
    pub fn endpoint(&self, address: IpAddr) -> Result<Option<Endpoint>> {
        let found = match address {
            IpAddr::V4(v4) => self.hash_map::<maps::ENDPOINTS_V4>()?.get(&v4.octets(), 0),
            IpAddr::V6(v6) => self.hash_map::<maps::ENDPOINTS_V6>()?.get(&v6.octets(), 0),
        };
        match found {
            Ok(endpoint) => Ok(Some(endpoint)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(Error::bpf("reading an endpoint", e)),
        }
    }

    /// Every address the datapath knows, with its endpoint.
    pub fn all_endpoints(&self) -> Result<Vec<(IpAddr, Endpoint)>> {
        let mut all = Vec::new();
        for entry in self.hash_map::<maps::ENDPOINTS_V4>()?.iter() {
            let (ip, endpoint) = entry.map_err(|e| Error::bpf("listing endpoints", e))?;
            all.push((IpAddr::from(ip), endpoint));
        }
        for entry in self.hash_map::<maps::ENDPOINTS_V6>()?.iter() {
            let (ip, endpoint) = entry.map_err(|e| Error::bpf("listing endpoints", e))?;
            all.push((IpAddr::from(ip), endpoint));
        }
        Ok(all)
    }

    /// The host veths the datapath serves (ifindex -> endpoint).
    pub fn host_veths(&self) -> Result<Vec<(u32, Endpoint)>> {
        self.hash_map::<maps::HOST_VETHS>()?
            .iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::bpf("listing host veths", e))
    }

    /// How many pods the network has; 0 when its maps are not pinned.
    pub fn pod_count(&self) -> Result<usize> {
        if !self.map_path(MAP_HOST_VETHS).exists() {
            return Ok(0);
        }
        Ok(self.host_veths()?.len())
    }

    /// True when the network has no pod: one map lookup, not a count.
    pub fn has_no_pod(&self) -> Result<bool> {
        if !self.map_path(MAP_HOST_VETHS).exists() {
            return Ok(true);
        }
        Ok(self.hash_map::<maps::HOST_VETHS>()?.keys().next().is_none())
    }

    /// True when no pod of the network has its host veth any more: pods
    /// whose veth is gone (a crash, a netns deleted without DEL) do not
    /// keep the network. Stops at the first live one, so with pods left
    /// it costs one lookup, as `has_no_pod` does.
    pub fn has_no_live_pod(&self) -> Result<bool> {
        if !self.map_path(MAP_HOST_VETHS).exists() {
            return Ok(true);
        }
        let veths = self.hash_map::<maps::HOST_VETHS>()?;
        for index in veths.keys() {
            let index = index.map_err(|e| Error::bpf("reading HOST_VETHS", e))?;
            if !crate::netlink::ifindex_is_gone(index) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Forgets the pod behind host veth `index`. With its `addresses` known
    /// (DEL's prevResult: the result ADD returned) this costs a few lookups,
    /// however many pods the node has; without, the address maps are
    /// searched. Addresses first, so nothing is redirected to it any more.
    pub fn remove_pod(&self, index: u32, addresses: Option<&[IpAddr]>) -> Result<()> {
        match addresses {
            Some(addresses) => {
                // Each address map opened once, and only for a family the
                // pod has: this runs on every DEL.
                let (v4, v6): (Vec<Ipv4Key>, Vec<Ipv6Key>) = (
                    addresses
                        .iter()
                        .filter_map(|a| match a {
                            IpAddr::V4(v4) => Some(v4.octets()),
                            IpAddr::V6(_) => None,
                        })
                        .collect(),
                    addresses
                        .iter()
                        .filter_map(|a| match a {
                            IpAddr::V6(v6) => Some(v6.octets()),
                            IpAddr::V4(_) => None,
                        })
                        .collect(),
                );
                if !v4.is_empty()
                    && let Some(mut map) = self.pinned_hash_map::<maps::ENDPOINTS_V4>()?
                {
                    remove_if_pointing_at(&mut map, &v4, index)?;
                }
                if !v6.is_empty()
                    && let Some(mut map) = self.pinned_hash_map::<maps::ENDPOINTS_V6>()?
                {
                    remove_if_pointing_at(&mut map, &v6, index)?;
                }
            }
            None => self.remove_addresses_of(|i| i == index)?,
        }
        // No HOST_VETHS pinned (a load killed before it): no pod to clear.
        let Some(mut veths) = self.pinned_hash_map::<maps::HOST_VETHS>()? else {
            return Ok(());
        };
        if let Ok(endpoint) = veths.get(&index, 0) {
            self.clear_pod_policy(endpoint.counter_slot)?;
            self.clear_sources(endpoint.counter_slot)?;
            self.release_counter_slot(endpoint.counter_slot);
        }
        ignore_missing(veths.remove(&index))
    }

    /// Removes the addresses whose host veth `doomed` selects.
    pub(super) fn remove_addresses_of(&self, doomed: impl Fn(u32) -> bool) -> Result<()> {
        self.remove_entries::<maps::ENDPOINTS_V4>(&doomed)?;
        self.remove_entries::<maps::ENDPOINTS_V6>(&doomed)
    }

    /// Removes the entries of address map `M` whose host veth `doomed` selects.
    pub(super) fn remove_entries<M: TypedMap<Value = Endpoint>>(
        &self,
        doomed: &impl Fn(u32) -> bool,
    ) -> Result<()>
    where
        KeyOf<M>: aya::Pod,
    {
        let Some(mut map) = self.pinned_hash_map::<M>()? else {
            return Ok(());
        };
        let keys: Vec<KeyOf<M>> = map
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, ep)| doomed(ep.host_ifindex))
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            ignore_missing(map.remove(&key))?;
        }
        Ok(())
    }

    /// Forgets every pod whose host veth `doomed` selects (by ifindex):
    /// addresses first, so nothing is redirected to it any more.
    pub fn remove_pods(&self, doomed: impl Fn(u32) -> bool) -> Result<()> {
        self.remove_addresses_of(&doomed)?;
        let Some(mut veths) = self.pinned_hash_map::<maps::HOST_VETHS>()? else {
            return Ok(());
        };
        let pods: Vec<(u32, Endpoint)> = veths
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(index, _)| doomed(*index))
            .collect();
        for (index, endpoint) in pods {
            ignore_missing(veths.remove(&index))?;
            self.clear_pod_policy(endpoint.counter_slot)?;
            self.clear_sources(endpoint.counter_slot)?;
            self.release_counter_slot(endpoint.counter_slot);
        }
        Ok(())
    }
}

/// Removes each of `keys` whose endpoint is the pod behind host veth
/// `index` (an address already handed to another pod stays).
pub(super) fn remove_if_pointing_at<K: aya::Pod>(
    map: &mut HashMap<MapData, K, Endpoint>,
    keys: &[K],
    index: u32,
) -> Result<()> {
    for key in keys {
        match map.get(key, 0) {
            Ok(endpoint) if endpoint.host_ifindex == index => ignore_missing(map.remove(key))?,
            Ok(_) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(Error::bpf("reading an endpoint", e)),
        }
    }
    Ok(())
}

//! Counter slots: each pod's index into `ENDPOINT_STATS` and `POD_SOURCES`,
//! claimed with an exclusive file per slot so two ADDs never share one.

use std::path::{Path, PathBuf};

use aya::maps::PerCpuValues;
use aya::util::nr_cpus;
use flatnet_common::{
    Endpoint, EndpointCounters, KeyOf, MAX_ENDPOINTS, NO_COUNTER_SLOT, TypedMap, maps,
    preferred_slot,
};

use super::Datapath;
use super::typed::PerCpuArrayOf;
use crate::error::{Error, Result};
use crate::lock::LOCK_DIR;

impl Datapath {
    /// Where this network's counter slots are claimed: one file per slot in
    /// use, created exclusively (so two ADDs can never take the same slot),
    /// holding the host veth's ifindex. tmpfs, like the pins' lifetime.
    pub(super) fn slots_dir(&self) -> PathBuf {
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Path::new(LOCK_DIR).join(format!("slots-{name}"))
    }

    /// Claims a free counter slot for the pod behind host veth `index`; the
    /// search starts at a place derived from the ifindex, so it rarely probes.
    /// A slot whose owner's veth is gone (a crashed ADD) is taken over.
    pub fn claim_counter_slot(&self, index: u32) -> Result<u32> {
        let dir = self.slots_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let usable = MAX_ENDPOINTS - 1;
        for probe in 0..usable {
            // The first try is the slot the datapath computes from the
            // ifindex (`preferred_slot`), so it rarely has to look up.
            let slot = preferred_slot(index.wrapping_add(probe));
            let path = dir.join(slot.to_string());
            let mut took_over = false;
            for _attempt in 0..2 {
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                {
                    Ok(mut file) => {
                        use std::io::Write;
                        file.write_all(index.to_string().as_bytes())
                            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                        self.zero_counters(slot)?;
                        self.zero_policy_drops(slot)?;
                        if took_over {
                            // The crashed owner's policy must not become
                            // this pod's (DEL clears it; a crash did not).
                            self.clear_pod_policy(slot)?;
                        }
                        return Ok(slot);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let owner = std::fs::read_to_string(&path)
                            .ok()
                            .and_then(|t| t.trim().parse::<u32>().ok());
                        match owner {
                            Some(owner) if owner == index => return Ok(slot),
                            Some(owner) if crate::netlink::ifindex_is_gone(owner) => {
                                let _ = std::fs::remove_file(&path);
                                took_over = true;
                            }
                            _ => break,
                        }
                    }
                    Err(e) => return Err(Error::io(format!("claiming {}", path.display()), e)),
                }
            }
        }
        Err(Error::Datapath(format!(
            "no free counter slot: {usable} pods is this network's limit"
        )))
    }

    /// Gives a slot back (a removed pod, a failed ADD).
    pub fn release_counter_slot(&self, slot: u32) {
        if slot != NO_COUNTER_SLOT {
            let _ = std::fs::remove_file(self.slots_dir().join(slot.to_string()));
        }
    }

    /// The counter slot of an existing pod, claimed (and written into its
    /// entries) when an older build left it without one: upgrades, repairs.
    pub fn ensure_counter_slot(&self, index: u32) -> Result<u32> {
        let mut veths = self.hash_map::<maps::HOST_VETHS>()?;
        let mut endpoint = match veths.get(&index, 0) {
            Ok(endpoint) => endpoint,
            Err(aya::maps::MapError::KeyNotFound) => return self.claim_counter_slot(index),
            Err(e) => return Err(Error::bpf("reading a host veth", e)),
        };
        if endpoint.counter_slot != NO_COUNTER_SLOT {
            return Ok(endpoint.counter_slot);
        }
        endpoint.counter_slot = self.claim_counter_slot(index)?;
        let addresses = self.addresses_of(index)?;
        self.set_sources(endpoint.counter_slot, index, &addresses, 0)?;
        veths
            .insert(index, endpoint, 0)
            .map_err(|e| Error::bpf("updating a host veth", e))?;
        self.update_entries::<maps::ENDPOINTS_V4>(endpoint)?;
        self.update_entries::<maps::ENDPOINTS_V6>(endpoint)?;
        Ok(endpoint.counter_slot)
    }

    /// Rewrites the address entries of `endpoint`'s pod with `endpoint`.
    pub(super) fn update_entries<M: TypedMap<Value = Endpoint>>(
        &self,
        endpoint: Endpoint,
    ) -> Result<()>
    where
        KeyOf<M>: aya::Pod,
    {
        let mut map = self.hash_map::<M>()?;
        let keys: Vec<KeyOf<M>> = map
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, ep)| ep.host_ifindex == endpoint.host_ifindex)
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            map.insert(key, endpoint, 0)
                .map_err(|e| Error::bpf("updating an endpoint", e))?;
        }
        Ok(())
    }

    pub(super) fn zero_counters(&self, slot: u32) -> Result<()> {
        let cpus = nr_cpus().map_err(|(_, e)| Error::bpf("counting CPUs", e))?;
        let zeros = PerCpuValues::try_from(vec![EndpointCounters::default(); cpus])
            .map_err(|e| Error::bpf("building per-CPU counters", e))?;
        self.endpoint_counters()?
            .set(slot, zeros, 0)
            .map_err(|e| Error::bpf("zeroing a pod's counters", e))
    }

    pub(super) fn endpoint_counters(&self) -> Result<PerCpuArrayOf<maps::ENDPOINT_STATS>> {
        self.per_cpu_array::<maps::ENDPOINT_STATS>()
    }
}

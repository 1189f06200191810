//! What the datapath counted: per action, per pod.

use flatnet_common::{Counter, EndpointCounters, NO_COUNTER_SLOT, action, maps};

use super::Datapath;
use crate::error::{Error, Result};

impl Datapath {
    /// The action counters summed over all CPUs, indexed by `action`.
    pub fn stats(&self) -> Result<[Counter; action::COUNT as usize]> {
        let map = self.per_cpu_array::<maps::STATS>()?;
        let mut totals = [Counter::default(); action::COUNT as usize];
        for (index, total) in totals.iter_mut().enumerate() {
            let per_cpu = map
                .get(&(index as u32), 0)
                .map_err(|e| Error::bpf("reading counters", e))?;
            for counter in per_cpu.iter() {
                total.packets += counter.packets;
                total.bytes += counter.bytes;
            }
        }
        Ok(totals)
    }

    /// The traffic counted in one counter slot, summed over all CPUs (all
    /// zero for `NO_COUNTER_SLOT`). A pod's slot is in its `Endpoint`; a
    /// freed slot keeps its counts until an ADD claims and zeroes it.
    pub fn slot_counters(&self, slot: u32) -> Result<EndpointCounters> {
        if slot == NO_COUNTER_SLOT {
            return Ok(EndpointCounters::default());
        }
        let per_cpu = self
            .endpoint_counters()?
            .get(&slot, 0)
            .map_err(|e| Error::bpf("reading endpoint counters", e))?;
        Ok(per_cpu
            .iter()
            .fold(EndpointCounters::default(), |sum, c| EndpointCounters {
                tx_packets: sum.tx_packets + c.tx_packets,
                tx_bytes: sum.tx_bytes + c.tx_bytes,
                rx_packets: sum.rx_packets + c.rx_packets,
                rx_bytes: sum.rx_bytes + c.rx_bytes,
            }))
    }
}

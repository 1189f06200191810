//! The datapath's counters: per action (`STATS`) and per pod
//! (`ENDPOINT_STATS`), left out in a measurement without them.

use flatnet_common::NO_COUNTER_SLOT;

use crate::maps::endpoints::{ENDPOINT_STATS, STATS};
use crate::variant;

/// Which side of a pod's counters a frame goes to.
pub(crate) enum Direction {
    /// Sent by the pod.
    Tx,
    /// Delivered to the pod by the datapath.
    Rx,
}

#[inline(always)]
pub(crate) fn count_pod(slot: u32, direction: Direction, len: u32) {
    if slot == NO_COUNTER_SLOT || variant::without(flatnet_common::cost_variant::NO_COUNTERS) {
        return;
    }
    if let Some(counters) = ENDPOINT_STATS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            match direction {
                Direction::Tx => {
                    (*counters).tx_packets += 1;
                    (*counters).tx_bytes += u64::from(len);
                }
                Direction::Rx => {
                    (*counters).rx_packets += 1;
                    (*counters).rx_bytes += u64::from(len);
                }
            }
        }
    }
}

#[inline(always)]
pub(crate) fn count(what: u32, len: u32) {
    if variant::without(flatnet_common::cost_variant::NO_COUNTERS) {
        return;
    }
    if let Some(counter) = STATS.get_ptr_mut(what) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(len);
        }
    }
}

//! Local pods and the datapath's counters: `ENDPOINTS_*` by address,
//! `HOST_VETHS` and `POD_SOURCES` by host veth and counter slot, `STATS`
//! and `ENDPOINT_STATS`; and `COST_VARIANT`, the measurement a load runs.

use flatnet_common::cost_variant;

use super::map;

map!(
    /// Local pods by IPv4 address.
    ENDPOINTS_V4
);

map!(
    /// Local pods by IPv6 address.
    ENDPOINTS_V6
);

map!(
    /// The pod behind each host veth, by the veth's ifindex: who is asking when
    /// a frame arrives (neighbour answers need the host veth's MAC).
    HOST_VETHS
);

map!(
    /// Per-CPU packet/byte counters, indexed by `flatnet_common::action`.
    STATS
);

map!(
    /// Per-CPU traffic of each pod, by its `counter_slot`.
    ENDPOINT_STATS
);

map!(
    /// Each pod's own addresses by counter slot: the source check.
    POD_SOURCES
);

/// The measurement this load runs (`flatnet_common::cost_variant`; see
/// `variant`): set by the loader of a measurement, 0 in flatnet's own.
#[unsafe(no_mangle)]
pub(crate) static COST_VARIANT: u32 = cost_variant::FULL;

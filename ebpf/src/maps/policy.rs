//! NetworkPolicy's maps: each pod's state, the rules by peer CIDR, the
//! flows already judged, the drops and their events, and the node's own
//! addresses (see `policy`).

use super::map;

map!(
    /// Each pod's isolation and policy generation, by counter slot.
    POLICY_PODS
);

map!(
    /// (slot, direction, IPv4 peer prefix) -> what it allows.
    POLICY_V4
);

map!(
    /// (slot, direction, IPv6 peer prefix) -> what it allows.
    POLICY_V6
);

map!(
    /// (slot, direction, peer identity) -> what it allows.
    POLICY_PEERS
);

map!(
    /// IPv4 peer address -> its identity, for the addresses local pods'
    /// policies name by identity.
    PEER_IDS_V4
);

map!(
    /// IPv6 peer address -> its identity.
    PEER_IDS_V6
);

map!(
    /// Flows policy allowed, per pod and direction (see above).
    POLICY_FLOWS
);

map!(
    /// What policy dropped, per pod and direction.
    POLICY_DROPS
);

map!(
    /// One event per packet policy dropped, for `flatnet monitor`. Written with
    /// `bpf_ringbuf_output`, which never blocks: when the buffer is full (no
    /// reader, or a slow one) the event is lost and counted in `STATS`
    /// (`POLICY_EVENTS_LOST`).
    POLICY_EVENTS
);

map!(
    /// The node's own addresses: traffic from them into a pod (kubelet's
    /// probes) is always allowed.
    LOCAL_ADDRS
);

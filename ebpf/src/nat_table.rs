//! The NodePort path's translated flows by their replies' tuple
//! (`NAT_REVERSE`, in `maps::nodeport`): written and read by the path
//! (`nodeport`), and asked here for the flow verdicts (`flow`), which tell
//! a local backend's reply of such a flow from a packet the fast path may
//! take as it is. Kept below both, so that neither reaches into the other
//! for it.

use flatnet_common::{FlowKey, NatKey};

use crate::maps::nodeport::NAT_REVERSE;

/// Whether `key` is the replies' tuple of a flow the NodePort path
/// translated (both keys hold an IPv4 address in their first 4 bytes).
#[inline(never)]
pub(crate) fn replies_of_a_translated_flow(key: &FlowKey) -> bool {
    let nat = NatKey {
        src: key.src,
        dst: key.dst,
        src_port: key.sport,
        dst_port: key.dport,
        protocol: key.proto,
        family: key.family,
        _pad: [0; 2],
    };
    NAT_REVERSE.get_ptr(&nat).is_some()
}

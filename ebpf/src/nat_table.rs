//! The NodePort path's translated flows by their replies' tuple: written
//! and read by the path (`nodeport`), and read by the flow verdicts
//! (`flow`), which tell a local backend's reply of such a flow from a
//! packet the fast path may take as it is. Kept below both, so that
//! neither reaches into the other for it.

use aya_ebpf::{btf_maps::LruHashMap, macros::btf_map};
use flatnet_common::{FlowKey, NatKey, NatReverse, maps};

/// Translated flows by their replies' tuple.
#[btf_map]
pub(crate) static NAT_REVERSE: LruHashMap<
    NatKey,
    NatReverse,
    { maps::NAT_REVERSE.max_entries as usize },
> = LruHashMap::new();
const _: () = assert!(maps::NAT_REVERSE.holds::<NatKey, NatReverse>());

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

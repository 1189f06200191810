//! The maps and the constants the loader sets. Each map's static takes
//! its type, key, value and size from its spec in `flatnet_common::maps`
//! (`map!`), where the loader finds the same. Kept below the logic: the
//! feature modules import these, these import nothing of theirs.

use aya_ebpf::btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf};
use flatnet_common::{LpmKey, kind};

pub(crate) mod endpoints;
pub(crate) mod flow;
pub(crate) mod nodeport;
pub(crate) mod policy;
pub(crate) mod remote;
pub(crate) mod services;

/// The aya-ebpf map type of a kind of map (`flatnet_common::kind`), for a
/// key `K`, value `V`, ring buffer entry `E`, `N` entries and flags `F`;
/// `NEW` is an empty one, a static's initializer.
pub(crate) trait Static<K, V, E, const N: usize, const F: usize> {
    type Map;
    const NEW: Self::Map;
}

impl<K, V, const N: usize, const F: usize> Static<K, V, (), N, F> for kind::Hash {
    type Map = HashMap<K, V, N, F>;
    const NEW: Self::Map = HashMap::new();
}

impl<K, V, const N: usize, const F: usize> Static<K, V, (), N, F> for kind::LruHash {
    type Map = LruHashMap<K, V, N, F>;
    const NEW: Self::Map = LruHashMap::new();
}

impl<V, const N: usize, const F: usize> Static<u32, V, (), N, F> for kind::Array {
    type Map = Array<V, N, F>;
    const NEW: Self::Map = Array::new();
}

impl<V, const N: usize, const F: usize> Static<u32, V, (), N, F> for kind::PerCpuArray {
    type Map = PerCpuArray<V, N, F>;
    const NEW: Self::Map = PerCpuArray::new();
}

/// aya-ebpf's trie takes the prefixed data, and prefixes it itself.
impl<D, V, const N: usize, const F: usize> Static<LpmKey<D>, V, (), N, F> for kind::LpmTrie {
    type Map = LpmTrie<D, V, N, F>;
    const NEW: Self::Map = LpmTrie::new();
}

impl<E, const N: usize, const F: usize> Static<(), (), E, N, F> for kind::RingBuf {
    type Map = RingBuf<E, N, F>;
    const NEW: Self::Map = RingBuf::new();
}

impl<const N: usize, const F: usize> Static<u32, u32, (), N, F> for kind::ProgArray {
    type Map = ProgramArray<N, F>;
    const NEW: Self::Map = ProgramArray::new();
}

/// The static of the map of that name in `flatnet_common::maps`, of the
/// aya-ebpf type its spec's kind, key, value and size make; the static is
/// named as the map (the object's map name).
macro_rules! map {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[aya_ebpf::macros::btf_map]
        pub(crate) static $name: <flatnet_common::KindOf<flatnet_common::maps::$name> as $crate::maps::Static<
            flatnet_common::KeyOf<flatnet_common::maps::$name>,
            flatnet_common::ValueOf<flatnet_common::maps::$name>,
            flatnet_common::EventOf<flatnet_common::maps::$name>,
            { flatnet_common::maps::$name.max_entries as usize },
            { flatnet_common::maps::$name.flags as usize },
        >>::Map = <flatnet_common::KindOf<flatnet_common::maps::$name> as $crate::maps::Static<
            flatnet_common::KeyOf<flatnet_common::maps::$name>,
            flatnet_common::ValueOf<flatnet_common::maps::$name>,
            flatnet_common::EventOf<flatnet_common::maps::$name>,
            { flatnet_common::maps::$name.max_entries as usize },
            { flatnet_common::maps::$name.flags as usize },
        >>::NEW;
    };
}
pub(crate) use map;

//! Pinned maps opened by their typed spec (`flatnet_common::maps`): the
//! name, the kind and the key and value types all come from the spec, so
//! an accessor names the map and nothing else.

use aya::Pod;
use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, RingBuf};
use flatnet_common::{KeyOf, LpmKey, MapKind, TypedMap, ValueOf};

use super::Datapath;
use crate::error::{Error, Result};

/// The aya type of hash map (or LRU hash map) `M`.
pub(super) type HashOf<M> = HashMap<MapData, KeyOf<M>, ValueOf<M>>;
/// The aya type of array `M`.
pub(super) type ArrayOf<M> = Array<MapData, ValueOf<M>>;
/// The aya type of per-CPU array `M`.
pub(super) type PerCpuArrayOf<M> = PerCpuArray<MapData, ValueOf<M>>;
/// The aya type of LPM trie `M` (aya's trie takes the prefixed data).
pub(super) type TrieOf<M> = LpmTrie<MapData, <KeyOf<M> as Prefixed>::Data, ValueOf<M>>;

/// An LPM trie's key: what it prefixes.
pub(super) trait Prefixed {
    type Data;
}

impl<T> Prefixed for LpmKey<T> {
    type Data = T;
}

impl Datapath {
    /// Pinned map `M`, as the `Map` of its kind.
    fn typed_map<M: TypedMap>(&self) -> Result<Map> {
        let data = self.open_map(M::SPEC.name)?;
        Ok(match M::SPEC.kind {
            MapKind::Hash => Map::HashMap(data),
            MapKind::LruHash => Map::LruHashMap(data),
            MapKind::Array => Map::Array(data),
            MapKind::PerCpuArray => Map::PerCpuArray(data),
            MapKind::LpmTrie => Map::LpmTrie(data),
            MapKind::RingBuf => Map::RingBuf(data),
            MapKind::ProgArray => Map::ProgramArray(data),
        })
    }

    /// Pinned hash map (or LRU hash map) `M`.
    pub(super) fn hash_map<M: TypedMap>(&self) -> Result<HashOf<M>>
    where
        KeyOf<M>: Pod,
        ValueOf<M>: Pod,
    {
        HashMap::try_from(self.typed_map::<M>()?)
            .map_err(|e| Error::bpf(format!("opening {}", M::SPEC.name), e))
    }

    /// As [`hash_map`](Self::hash_map), None when the map is not pinned:
    /// a load killed half-way pins some maps and not others, and a map
    /// that is not pinned holds nothing of any pod.
    pub(super) fn pinned_hash_map<M: TypedMap>(&self) -> Result<Option<HashOf<M>>>
    where
        KeyOf<M>: Pod,
        ValueOf<M>: Pod,
    {
        if !self.map_path(M::SPEC.name).exists() {
            return Ok(None);
        }
        self.hash_map::<M>().map(Some)
    }

    /// Pinned array `M`.
    pub(super) fn array<M: TypedMap>(&self) -> Result<ArrayOf<M>>
    where
        ValueOf<M>: Pod,
    {
        Array::try_from(self.typed_map::<M>()?)
            .map_err(|e| Error::bpf(format!("opening {}", M::SPEC.name), e))
    }

    /// Pinned per-CPU array `M`.
    pub(super) fn per_cpu_array<M: TypedMap>(&self) -> Result<PerCpuArrayOf<M>>
    where
        ValueOf<M>: Pod,
    {
        PerCpuArray::try_from(self.typed_map::<M>()?)
            .map_err(|e| Error::bpf(format!("opening {}", M::SPEC.name), e))
    }

    /// Pinned LPM trie `M`.
    pub(super) fn lpm_trie<M: TypedMap>(&self) -> Result<TrieOf<M>>
    where
        KeyOf<M>: Prefixed,
        <KeyOf<M> as Prefixed>::Data: Pod,
        ValueOf<M>: Pod,
    {
        LpmTrie::try_from(self.typed_map::<M>()?)
            .map_err(|e| Error::bpf(format!("opening {}", M::SPEC.name), e))
    }

    /// Pinned ring buffer `M`.
    pub(super) fn ring_buf<M: TypedMap>(&self) -> Result<RingBuf<MapData>> {
        RingBuf::try_from(self.typed_map::<M>()?)
            .map_err(|e| Error::bpf(format!("opening {}", M::SPEC.name), e))
    }
}

//! How many entries the maps that grow with a node's work hold: by
//! default derived from the node's memory, never below the built-in size
//! (the floor), each overridable by name. The flow tables are preallocated
//! (their memory is taken at load), so they share a fraction of the
//! node's memory (`memoryRatio`, 0.25% by default, as Cilium's
//! `bpf-map-dynamic-size-ratio`); the policy maps are allocated as used,
//! so they scale with memory the same way but cost nothing until filled.
//!
//! Sizes grow in powers of two of the built-in ones, the largest that
//! keeps the flow tables within the budget: a 24 GiB node keeps the
//! built-in sizes, a 64 GiB one doubles them.
//!
//! The plugin (ADD) and the agent load the same datapath: both read the
//! sizing from the network's configuration (`mapSizes`, `mapMemoryRatio`,
//! written by the agent) and the node's `MemTotal`, so they agree.
//!
//! Plain std and flatnet-common only: the plugin's configuration parser
//! uses it, and the fuzz build compiles that parser with this file alone.

use std::collections::BTreeMap;

use flatnet_common::{
    MAP_FLOWS, MAP_NAT_FORWARD, MAP_NAT_REVERSE, MAP_PEER_IDS_V4, MAP_PEER_IDS_V6,
    MAP_POLICY_FLOWS, MAP_POLICY_PEERS, MAP_POLICY_V4, MAP_POLICY_V6, MAP_SPECS, MapSpec,
};

/// The maps sized for the node.
pub const SIZED_MAPS: [&str; 9] = [
    MAP_FLOWS,
    MAP_NAT_FORWARD,
    MAP_NAT_REVERSE,
    MAP_POLICY_FLOWS,
    MAP_POLICY_V4,
    MAP_POLICY_V6,
    MAP_POLICY_PEERS,
    MAP_PEER_IDS_V4,
    MAP_PEER_IDS_V6,
];

/// The fraction of memory the preallocated flow tables take together by
/// default.
pub const DEFAULT_MEMORY_RATIO: f64 = 0.0025;

/// The smallest size an override may give: a test fills a map this small.
pub const MIN_ENTRIES: u32 = 16;

/// What the network's configuration says about map sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct MapSizing {
    pub memory_ratio: f64,
    /// Map name -> entries, beating the derived size.
    pub overrides: BTreeMap<String, u32>,
}

// The ratio is never NaN (`validate` refuses it, the default is not):
// equality is total.
impl Eq for MapSizing {}

impl Default for MapSizing {
    fn default() -> Self {
        MapSizing {
            memory_ratio: DEFAULT_MEMORY_RATIO,
            overrides: BTreeMap::new(),
        }
    }
}

impl MapSizing {
    /// Checks what a configuration gave: a known map, a size in range, a
    /// ratio between 0 and 10%; what to fix, if not.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=0.1).contains(&self.memory_ratio) {
            return Err(format!(
                "\"mapMemoryRatio\" {} is out of range: use 0 (the built-in sizes) to 0.1",
                self.memory_ratio
            ));
        }
        for (name, entries) in &self.overrides {
            if !SIZED_MAPS.contains(&name.as_str()) {
                return Err(format!(
                    "\"mapSizes\" names {name}, which is not sized per node: use one of {}",
                    SIZED_MAPS.join(", ")
                ));
            }
            if !(MIN_ENTRIES..=1 << 24).contains(entries) {
                return Err(format!(
                    "\"mapSizes\": {name} of {entries} entries is out of range: use {MIN_ENTRIES} to {}",
                    1 << 24
                ));
            }
        }
        Ok(())
    }

    /// Each sized map's entries on a node with `memory` bytes.
    pub fn sizes(&self, memory: u64) -> BTreeMap<&'static str, u32> {
        let specs: Vec<&MapSpec> = SIZED_MAPS
            .iter()
            .filter_map(|name| MAP_SPECS.iter().find(|s| s.name == *name))
            .collect();
        let flow_tables = [
            MAP_FLOWS,
            MAP_NAT_FORWARD,
            MAP_NAT_REVERSE,
            MAP_POLICY_FLOWS,
        ];
        // What the flow tables cost at their floors, and the budget: they
        // grow together by the same factor until they fill it.
        let floor_bytes: u64 = specs
            .iter()
            .filter(|s| flow_tables.contains(&s.name))
            .map(|s| u64::from(s.max_entries) * entry_bytes(s))
            .sum();
        let budget = (memory as f64 * self.memory_ratio) as u64;
        // A power of two (the kernel rounds hash buckets to one anyway),
        // the largest that keeps the tables within the budget; 1 below it.
        let mut factor: u32 = 1;
        while u64::from(factor) * 2 * floor_bytes <= budget && factor < 1 << 8 {
            factor *= 2;
        }
        specs
            .iter()
            .map(|spec| {
                let derived = spec.max_entries.saturating_mul(factor).min(1 << 24);
                let entries = self.overrides.get(spec.name).copied().unwrap_or(derived);
                (spec.name, entries)
            })
            .collect()
    }
}

/// What one entry of `spec` costs the kernel: key and value rounded to 8
/// bytes, and a hash element's header (48 bytes with its LRU node).
fn entry_bytes(spec: &MapSpec) -> u64 {
    let round = |n: u32| u64::from(n.div_ceil(8) * 8);
    round(spec.key_size) + round(spec.value_size) + 48
}

/// The node's memory (`MemTotal` of /proc/meminfo), in bytes.
pub fn node_memory() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| std::io::Error::other("no MemTotal line"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn floor(name: &str) -> u32 {
        MAP_SPECS
            .iter()
            .find(|s| s.name == name)
            .unwrap()
            .max_entries
    }

    #[test]
    fn a_small_node_keeps_the_built_in_sizes() {
        let sizes = MapSizing::default().sizes(GIB);
        for name in SIZED_MAPS {
            assert_eq!(sizes[name], floor(name), "{name}");
        }
    }

    #[test]
    fn a_bigger_node_gets_bigger_flow_tables_within_its_ratio() {
        let sizing = MapSizing::default();
        let sizes = sizing.sizes(64 * GIB);
        assert!(sizes[MAP_FLOWS] > floor(MAP_FLOWS), "{sizes:?}");
        assert_eq!(
            sizes[MAP_NAT_FORWARD] / sizes[MAP_FLOWS],
            2,
            "in proportion"
        );
        let bytes: u64 = [
            MAP_FLOWS,
            MAP_NAT_FORWARD,
            MAP_NAT_REVERSE,
            MAP_POLICY_FLOWS,
        ]
        .iter()
        .map(|n| {
            let spec = MAP_SPECS.iter().find(|s| s.name == *n).unwrap();
            u64::from(sizes[n]) * entry_bytes(spec)
        })
        .sum();
        // Within the budget, and more than half of it.
        let budget = (64.0 * GIB as f64 * sizing.memory_ratio) as u64;
        assert!(bytes <= budget, "{bytes} for a budget of {budget}");
        assert!(bytes * 2 > budget, "{bytes} for a budget of {budget}");
    }

    #[test]
    fn overrides_win_and_bad_ones_say_what_to_fix() {
        let mut sizing = MapSizing::default();
        sizing.overrides.insert(MAP_POLICY_PEERS.into(), 64);
        sizing.validate().unwrap();
        assert_eq!(sizing.sizes(64 * GIB)[MAP_POLICY_PEERS], 64);
        sizing.overrides.insert("ENDPOINTS_V4".into(), 64);
        let error = sizing.validate().unwrap_err().to_string();
        assert!(
            error.contains("ENDPOINTS_V4, which is not sized per node"),
            "{error}"
        );
        sizing.overrides.clear();
        sizing.overrides.insert(MAP_FLOWS.into(), 4);
        let error = sizing.validate().unwrap_err().to_string();
        assert!(error.contains("use 16 to"), "{error}");
        sizing.overrides.clear();
        sizing.memory_ratio = 0.5;
        assert!(sizing.validate().is_err());
    }

    #[test]
    fn this_machines_memory_is_read() {
        assert!(node_memory().unwrap() > GIB);
    }
}

//! What the agent puts on the node beside the datapath's pins, named both
//! where `run` sets it up and where `uninstall` takes it away: the
//! network's configuration, the uplink's tc filter slot, and the files it
//! removes.

use std::path::Path;

use crate::config::Args;
use crate::error::{AgentError, Result};
use flatnet::config::NetConf;

/// tc filter priority and handle of `from_uplink` on the uplink: its own
/// slot, so other tc users of the uplink keep theirs, and a restart or an
/// upgrade replaces it in one request.
pub const UPLINK_TC_PRIORITY: u16 = 0xf1a7;
pub const UPLINK_TC_HANDLE: u32 = 0xf1a7;

/// The flatnet plugin configuration the agent loads the datapath for
/// (validates the network name and gateway device as the plugin would).
pub fn network_conf(args: &Args) -> Result<NetConf> {
    let mut sizes = serde_json::Map::new();
    for pair in &args.map_sizes {
        let parsed = pair
            .split_once('=')
            .and_then(|(name, n)| Some((name.trim(), n.trim().parse::<u32>().ok()?)));
        let Some((name, entries)) = parsed else {
            return Err(AgentError::Config(format!(
                "--map-size {pair:?}: use NAME=ENTRIES, e.g. POLICY_PEERS=131072"
            )));
        };
        sizes.insert(name.to_string(), entries.into());
    }
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": args.network,
        "type": "flatnet",
        "bridge": args.bridge,
        "datapath": flatnet_datapath::DatapathMode::from(args.datapath).as_str(),
        "pinRoot": args.pin_root.display().to_string(),
        "mapSizes": sizes,
        "mapMemoryRatio": args.map_memory_ratio,
    });
    Ok(NetConf::parse(conf.to_string().as_bytes())?)
}

/// Removes `path`; true when it was there.
pub fn remove_if_present(path: &Path) -> Result<bool> {
    flatnet_datapath::util::remove_file_if_present(path)
        .map_err(|e| AgentError::io(format!("removing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn conf_with(flags: &[&str]) -> Result<NetConf> {
        let mut all = vec!["flatnet-agent", "--node-name", "n1"];
        all.extend(flags);
        network_conf(&Args::try_parse_from(all).unwrap())
    }

    #[test]
    fn map_sizes_from_flags_reach_the_network_conf() {
        let conf = conf_with(&["--map-size", "POLICY_PEERS=64,PEER_IDS_V4=1024"]).unwrap();
        let overrides = &conf.map_sizing.overrides;
        assert_eq!(overrides["POLICY_PEERS"], 64);
        assert_eq!(overrides["PEER_IDS_V4"], 1024);
        let conf = conf_with(&["--map-memory-ratio", "0"]).unwrap();
        assert_eq!(conf.map_sizing.memory_ratio, 0.0);
    }

    #[test]
    fn bad_map_sizes_say_what_to_fix() {
        let error = conf_with(&["--map-size", "POLICY_PEERS"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("use NAME=ENTRIES"), "{error}");
        let error = conf_with(&["--map-size", "ENDPOINTS_V4=64"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("not sized per node"), "{error}");
        let error = conf_with(&["--map-memory-ratio", "0.5"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("\"mapMemoryRatio\" 0.5 is out of range"),
            "{error}"
        );
    }
}

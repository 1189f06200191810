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
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": args.network,
        "type": "flatnet",
        "bridge": args.bridge,
        "datapath": flatnet_datapath::DatapathMode::from(args.datapath).as_str(),
        "pinRoot": args.pin_root.display().to_string(),
    });
    Ok(NetConf::parse(conf.to_string().as_bytes())?)
}

/// Removes `path`; true when it was there.
pub fn remove_if_present(path: &Path) -> Result<bool> {
    flatnet_datapath::util::remove_file_if_present(path)
        .map_err(|e| AgentError::io(format!("removing {}", path.display()), e))
}

//! NetworkPolicy's data-plane cost: a flatnet pair whose two pods 100
//! policies select (isolated both ways, every policy allowing the
//! benchmark's traffic among its own peers and ports), measured in the
//! same rounds as the plain flatnet pair. The policies reach the maps
//! through the agent's own computation and sync, in the tests crate's
//! `flatnet-policy-fixture` (xtask cannot link the flatnet library).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, ensure};
use serde_json::Value;

use crate::util::{self, output};

pub const POLICIES: usize = 100;
pub const LABEL: &str = "flatnet-policy";
pub const NETWORK: &str = "fb-flatnet-pol";
const FIXTURE: &str = "flatnet-policy-fixture";

/// Builds the fixture (debug: it only writes maps).
pub fn build_fixture() -> anyhow::Result<PathBuf> {
    util::build_debug()?;
    Ok(util::target_dir(false).join(FIXTURE))
}

/// Puts `POLICIES` policies on the pair's pods in `network`'s maps:
/// {"policies", "isolated_pods", "rules"}.
pub fn apply(
    fixture: &PathBuf,
    network: &str,
    client_ip: &str,
    server_ip: &str,
) -> anyhow::Result<Value> {
    let printed =
        output(Command::new(fixture).args([network, client_ip, server_ip, &POLICIES.to_string()]))
            .context("the NetworkPolicy fixture")?;
    let summary: Value =
        serde_json::from_str(printed.trim()).context("the NetworkPolicy fixture's JSON line")?;
    ensure!(
        summary["isolated_pods"] == 2,
        "the fixture isolated {} pods, not the pair's two",
        summary["isolated_pods"]
    );
    Ok(summary)
}

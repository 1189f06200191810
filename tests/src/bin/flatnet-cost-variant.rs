//! `cargo xtask bench`'s program variants: puts a cut-down `from_pod`
//! (`flatnet_common::cost_variant`) in front of a benchmark network's own
//! on one host veth, so the benchmark can time the program with and
//! without each of its parts on the same flood. The variant is this
//! build's object, loaded on the network's pinned maps, as flatnet's own
//! load does (`Datapath::attach_cost_variant`). xtask cannot do this
//! itself: it is built before bpf-linker, which the flatnet library needs.
//!
//! Usage: flatnet-cost-variant <network> <host-veth> <variant> <link-pin>
//! Prints one JSON line: {"variant", "program_id", "instructions",
//! "jited_bytes"}. Removing <link-pin>
//! takes the variant off.

use std::path::Path;

use anyhow::{Context, bail};
use flatnet_common::cost_variant;
use flatnet_datapath::bpf::Datapath;
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [network, host_veth, variant, link_pin] = args.as_slice() else {
        bail!("usage: flatnet-cost-variant <network> <host-veth> <variant> <link-pin>");
    };
    let known = || cost_variant::NAMES.map(|(_, name)| name).join(", ");
    let value = cost_variant::named(variant)
        .with_context(|| format!("no variant {variant:?}: one of {}", known()))?;
    let loaded = Datapath::new(network)
        .attach_cost_variant(value, host_veth, Path::new(link_pin))
        .with_context(|| format!("putting {variant} on {host_veth}"))?;
    println!(
        "{}",
        json!({
            "variant": variant,
            "program_id": loaded.program_id,
            "instructions": loaded.instructions,
            "jited_bytes": loaded.jited_bytes,
        })
    );
    Ok(())
}

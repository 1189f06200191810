//! What sits at a device's tc hooks (tcx links, cls_bpf filters), as
//! bpftool lists it.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::{bpftool, wait_until};

/// What bpftool printed, for a test: judged by its output (bookworm-backports'
/// 7.5.0 exits 255 after a correct `link show`), panics on a real error.
#[track_caller]
pub fn bpftool_ok(cmd: &mut Command) -> String {
    bpftool(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// One entry at a tc hook of a device, as `bpftool net` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcHook {
    /// "tcx/ingress", "clsact/ingress", ...
    pub kind: String,
    pub program: String,
    pub program_id: u32,
    /// The BPF link holding it (tcx), None for a cls_bpf filter.
    pub link_id: Option<u32>,
}

/// Waits until a pod's host veth `dev` has its two programs on tcx links
/// and nothing else at its tc hooks (`from_pod` at ingress, `to_pod` at
/// egress): ADD attaches cls_bpf filters and moves them to their links in
/// a process it leaves behind.
pub fn wait_for_tcx(dev: &str) {
    wait_until(
        &format!("{dev} to be on its tcx links alone"),
        Duration::from_secs(10),
        || {
            let hooks = tc_hooks(dev);
            hooks.len() == 2 && hooks.iter().all(|hook| hook.link_id.is_some())
        },
    );
}

/// What sits at the tc hooks of `dev` in the caller's namespace (tcx links
/// and cls_bpf filters), from `bpftool -j net show` (bpftool 7.3+ for tcx).
pub fn tc_hooks(dev: &str) -> Vec<TcHook> {
    let out = bpftool_ok(Command::new("bpftool").args(["-j", "net", "show", "dev", dev]));
    let listed: Value = serde_json::from_str(&out).expect("bpftool's JSON");
    let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    listed[0]["tc"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| TcHook {
            kind: entry["kind"].as_str().unwrap_or_default().to_string(),
            program: entry["name"].as_str().unwrap_or_default().to_string(),
            // "prog_id" for tcx, "id" for a cls_bpf filter.
            program_id: id(&entry["prog_id"])
                .or_else(|| id(&entry["id"]))
                .unwrap_or_default(),
            link_id: id(&entry["link_id"]),
        })
        .collect()
}

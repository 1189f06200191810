//! The live demo: two pods (network namespaces) attached through the
//! installed plugin and conflist exactly as a runtime would, traffic between
//! them, the datapath's counters and the bpftool view; then a clean DEL.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use flatnet_common::{MAP_ENDPOINTS_V4, MAP_STATS, PIN_ROOT, action};
use flatnet_harness::{Listed, Netns, made_here};

use crate::cni::{Plugin, first_ip, first_plugin_conf};
use crate::install::{CONFLIST_FILE, InstallArgs, REFERENCE_PLUGINS};
use crate::util::{heading, run_bpftool, run_cmd};

/// What the demo created; DEL and namespace removal on drop, even when a
/// step failed.
struct Demo {
    plugin: Plugin,
    /// Each pod's namespace, container id, and its DEL listed for a signal
    /// (run before the namespace, listed earlier, is deleted).
    pods: Vec<(Netns, String, Listed)>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        for (netns, container_id, listed) in self.pods.drain(..) {
            delete_pod(&self.plugin, &container_id, &netns.path());
            listed.removed();
        }
    }
}

fn delete_pod(plugin: &Plugin, container_id: &str, netns: &Path) {
    if let Err(e) = plugin.call("DEL", container_id, netns) {
        eprintln!("demo cleanup: {e}");
    }
}

pub fn run(args: &InstallArgs) -> anyhow::Result<()> {
    heading("demo: two pods on the flatnet network");
    let (network, conf) = first_plugin_conf(&args.conf_dir.join(CONFLIST_FILE))?;
    let plugin = Plugin::new(
        args.bin_dir.join("flatnet"),
        &format!("{}:{REFERENCE_PLUGINS}", args.bin_dir.display()),
        conf,
    );
    let mut demo = Demo {
        plugin,
        pods: Vec::new(),
    };
    let mut pods = Vec::new();
    for name in ["a", "b"] {
        let netns = Netns::named(&format!("flatnet-demo-{name}"))?;
        let container_id = format!("flatnet-demo-{name}");
        let result = demo.plugin.call("ADD", &container_id, &netns.path())?;
        let ip = first_ip(&result)?;
        let host_veth = result["interfaces"][0]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!(
            "pod {name}: netns {} eth0 {ip}  (host side {host_veth})",
            netns.path().display()
        );
        pods.push((ip, host_veth));
        // ^C during the demo: the pod's address and the network's pins go
        // with its DEL, as on drop.
        let listed = {
            let (plugin, container_id, path) =
                (demo.plugin.clone(), container_id.clone(), netns.path());
            made_here(move || delete_pod(&plugin, &container_id, &path))
        };
        demo.pods.push((netns, container_id, listed));
    }
    let ((ip_a, veth_a), (ip_b, _)) = (&pods[0], &pods[1]);
    let (ns_a, ns_b) = (&demo.pods[0].0, &demo.pods[1].0);

    heading(&format!("ping pod a -> pod b ({ip_b})"));
    run_cmd(&mut ns_a.command(&["ping", "-c", "3", "-i", "0.2", ip_b]))?;

    heading(&format!(
        "TCP, pod b -> pod a, 3 s of iperf3 ({ip_b} -> {ip_a})"
    ));
    let mut server = ns_a
        .command(&["iperf3", "-s", "-1", "-B", ip_a])
        .stdout(Stdio::null())
        .spawn()
        .context("starting iperf3 in pod a")?;
    std::thread::sleep(Duration::from_millis(500));
    let client = run_cmd(&mut ns_b.command(&["iperf3", "-c", ip_a, "-t", "3", "-f", "g"]));
    let _ = server.wait();
    client?;

    let pins = Path::new(PIN_ROOT).join(network.replace('.', "~"));
    heading("datapath counters (STATS, summed over CPUs)");
    let dump: serde_json::Value = serde_json::from_str(&flatnet_harness::bpftool(
        Command::new("bpftool")
            .args(["-j", "map", "dump", "pinned"])
            .arg(pins.join(MAP_STATS)),
    )?)?;
    println!("{:<18} {:>10} {:>14}", "action", "packets", "bytes");
    for raw in dump.as_array().into_iter().flatten() {
        // With BTF, bpftool's JSON carries the typed view under "formatted".
        let entry = raw.get("formatted").unwrap_or(raw);
        let key = entry["key"].as_u64().unwrap_or(u64::MAX) as usize;
        let (mut packets, mut bytes) = (0, 0);
        for cpu in entry["values"].as_array().into_iter().flatten() {
            packets += cpu["value"]["packets"].as_u64().unwrap_or(0);
            bytes += cpu["value"]["bytes"].as_u64().unwrap_or(0);
        }
        let name = action::NAMES.get(key).copied().unwrap_or("?");
        println!("{name:<18} {packets:>10} {bytes:>14}");
    }

    heading("flatnet inspect: pods, per-pod counters, programs");
    run_cmd(Command::new(args.bin_dir.join("flatnet")).args(["inspect", "--network", &network]))?;

    heading("bpftool: the endpoint map, with field names from BTF");
    run_bpftool(
        &["map", "dump", "pinned"],
        Some(&pins.join(MAP_ENDPOINTS_V4)),
    )?;
    heading("bpftool: what is pinned and attached");
    run_cmd(Command::new("ls").arg("-l").arg(&pins))?;
    run_bpftool(&["net", "show", "dev", veth_a], None)?;
    heading("bpftool: the pod's tcx link, pinned under links/");
    // bookworm-backports' bpftool 7.5.0 exits 255 after this (correct)
    // answer: judged by what it printed.
    run_bpftool(
        &["link", "show", "pinned"],
        Some(&pins.join("links").join(format!("veth-{veth_a}"))),
    )?;

    heading("DEL both pods");
    for (netns, container_id, listed) in std::mem::take(&mut demo.pods) {
        demo.plugin.call("DEL", &container_id, &netns.path())?;
        listed.removed();
        println!("deleted {container_id}");
    }
    println!("done: the pods, their veths, addresses and endpoint entries are gone");
    Ok(())
}

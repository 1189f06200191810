//! The live demo: two pods (network namespaces) attached through the
//! installed plugin and conflist exactly as a runtime would, traffic between
//! them, the datapath's counters and the bpftool view; then a clean DEL.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use flatnet_common::{MAP_ENDPOINTS_V4, MAP_STATS, PIN_ROOT, action};

use crate::install::{CONFLIST_FILE, InstallArgs, REFERENCE_PLUGINS};
use crate::util::{heading, output, run_cmd};

/// A pod of the demo: its netns and, once added, its address.
struct Pod {
    netns: String,
    container_id: String,
    ip: Option<String>,
    host_veth: Option<String>,
}

/// Everything the demo created; removed on drop, even when a step failed.
struct Demo {
    plugin: PathBuf,
    cni_path: String,
    plugin_conf: String,
    pods: Vec<Pod>,
}

impl Demo {
    fn cni(&self, command: &str, pod: &Pod) -> anyhow::Result<serde_json::Value> {
        let mut child = Command::new(&self.plugin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", format!("/run/netns/{}", pod.netns))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.plugin.display()))?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(self.plugin_conf.as_bytes())?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "flatnet {command} failed: {}{}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(if stdout.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&stdout)?
        })
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let pods = std::mem::take(&mut self.pods);
        for pod in &pods {
            if let Err(e) = self.cni("DEL", pod) {
                eprintln!("demo cleanup: {e}");
            }
            let _ = Command::new("ip")
                .args(["netns", "del", &pod.netns])
                .status();
        }
    }
}

fn netns_exec(netns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).args(args);
    cmd
}

/// The configuration a runtime hands the first plugin of a conflist.
fn first_plugin_conf(conflist: &Path) -> anyhow::Result<(String, String)> {
    let list: serde_json::Value = serde_json::from_slice(&std::fs::read(conflist)?)?;
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    let name = list["name"]
        .as_str()
        .context("conflist has no name")?
        .to_string();
    Ok((name, plugin.to_string()))
}

pub fn run(args: &InstallArgs) -> anyhow::Result<()> {
    heading("demo: two pods on the flatnet network");
    let conflist = args.conf_dir.join(CONFLIST_FILE);
    let (network, plugin_conf) = first_plugin_conf(&conflist)?;
    let mut demo = Demo {
        plugin: args.bin_dir.join("flatnet"),
        cni_path: format!("{}:{REFERENCE_PLUGINS}", args.bin_dir.display()),
        plugin_conf,
        pods: Vec::new(),
    };
    for name in ["a", "b"] {
        let netns = format!("flatnet-demo-{name}");
        // A namespace left by an interrupted demo is replaced.
        let _ = Command::new("ip").args(["netns", "del", &netns]).output();
        run_cmd(Command::new("ip").args(["netns", "add", &netns]))?;
        demo.pods.push(Pod {
            netns,
            container_id: format!("flatnet-demo-{name}"),
            ip: None,
            host_veth: None,
        });
        let pod_index = demo.pods.len() - 1;
        let result = demo.cni("ADD", &demo.pods[pod_index])?;
        let ip = result["ips"][0]["address"]
            .as_str()
            .context("ADD result has no address")?;
        let ip = ip.split('/').next().unwrap_or(ip).to_string();
        let host_veth = result["interfaces"][0]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!(
            "pod {name}: netns /run/netns/{} eth0 {ip}  (host side {host_veth})",
            demo.pods[pod_index].netns
        );
        demo.pods[pod_index].ip = Some(ip);
        demo.pods[pod_index].host_veth = Some(host_veth);
    }
    let (a, b) = (&demo.pods[0], &demo.pods[1]);
    let (ip_a, ip_b) = (
        a.ip.clone().unwrap_or_default(),
        b.ip.clone().unwrap_or_default(),
    );

    heading(&format!("ping pod a -> pod b ({ip_b})"));
    run_cmd(&mut netns_exec(
        &a.netns,
        &["ping", "-c", "3", "-i", "0.2", &ip_b],
    ))?;

    heading(&format!(
        "TCP, pod b -> pod a, 3 s of iperf3 ({ip_b} -> {ip_a})"
    ));
    let mut server = netns_exec(&a.netns, &["iperf3", "-s", "-1", "-B", &ip_a])
        .stdout(Stdio::null())
        .spawn()
        .context("starting iperf3 in pod a")?;
    std::thread::sleep(Duration::from_millis(500));
    let client = run_cmd(&mut netns_exec(
        &b.netns,
        &["iperf3", "-c", &ip_a, "-t", "3", "-f", "g"],
    ));
    let _ = server.wait();
    client?;

    let pins = Path::new(PIN_ROOT).join(network.replace('.', "~"));
    heading("datapath counters (STATS, summed over CPUs)");
    let stats = pins.join(MAP_STATS);
    let dump: serde_json::Value = serde_json::from_str(&output(
        Command::new("bpftool")
            .args(["-j", "map", "dump", "pinned"])
            .arg(&stats),
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

    heading("bpftool: the endpoint map, with field names from BTF");
    run_cmd(
        Command::new("bpftool")
            .args(["map", "dump", "pinned"])
            .arg(pins.join(MAP_ENDPOINTS_V4)),
    )?;
    heading("bpftool: what is pinned and attached");
    run_cmd(Command::new("ls").arg("-l").arg(&pins))?;
    if let Some(veth) = &a.host_veth {
        run_cmd(Command::new("bpftool").args(["net", "show", "dev", veth]))?;
    }

    heading("DEL both pods");
    for pod in std::mem::take(&mut demo.pods) {
        demo.cni("DEL", &pod)?;
        run_cmd(Command::new("ip").args(["netns", "del", &pod.netns]))?;
    }
    println!("done: the pods, their veths, addresses and endpoint entries are gone");
    Ok(())
}

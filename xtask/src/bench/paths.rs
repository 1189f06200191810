//! The paths under test: a pair of pods per path, with servers in pod b,
//! and the three data-plane measurements run from pod a.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use flatnet_harness::Netns;

use crate::cni::{Plugin, first_ip};
use crate::util::output;

const IPERF_PORT: &str = "5201";
/// Throughput clients (and with veth, the softirq work of their packets) on
/// one CPU, servers on the other, the same for every path: on 2 cores,
/// unpinned runs differ by 2x depending on where the scheduler puts them.
/// The latency client shares the server's CPU: across CPUs every round trip
/// is two cross-CPU wake-ups, which dwarf the path under test.
const CLIENT_CPU: usize = 0;
pub const SERVER_CPU: usize = 1;

/// `args` run under `taskset -c cpu` when the machine has that CPU.
fn pinned(cpu: usize, args: &[&str]) -> Vec<String> {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut out = Vec::new();
    if cpus > cpu {
        out.extend(["taskset".to_string(), "-c".to_string(), cpu.to_string()]);
    }
    out.extend(args.iter().map(|a| a.to_string()));
    out
}

/// Two pods connected one way or another, servers listening in `b`.
pub struct Pair {
    pub label: &'static str,
    a: Netns,
    b: Netns,
    pub ip_a: String,
    pub ip_b: String,
    /// Pod a's host-side interface ("" for a bare veth pair).
    pub host_veth_a: String,
    plugin: Option<Plugin>,
    servers: Vec<Child>,
}

impl Pair {
    /// Two pods attached by `plugin`, as a runtime would.
    pub fn attached(label: &'static str, plugin: Plugin) -> anyhow::Result<Self> {
        let a = Netns::named(&format!("fb-{label}-a"))?;
        let b = Netns::named(&format!("fb-{label}-b"))?;
        let mut pair = Pair {
            label,
            a,
            b,
            ip_a: String::new(),
            ip_b: String::new(),
            host_veth_a: String::new(),
            plugin: Some(plugin),
            servers: Vec::new(),
        };
        for (netns, id) in [(&pair.a, "a"), (&pair.b, "b")] {
            let plugin = pair.plugin.as_ref().context("plugin")?;
            let result = plugin.call("ADD", &format!("fb-{label}-{id}"), &netns.path())?;
            let ip = first_ip(&result)?;
            if id == "a" {
                pair.ip_a = ip;
                pair.host_veth_a = host_interface(&result).unwrap_or_default();
            } else {
                pair.ip_b = ip;
            }
        }
        pair.start_servers()?;
        Ok(pair)
    }

    /// The ceiling: a bare veth pair straight between the two namespaces,
    /// with the kernel's default GSO/GRO limits, or (`big_tcp`) raised to
    /// that size on both ends as flatnet's `bigTcp` does: the pair that
    /// says how much of a gain is BIG TCP's and how much the path's.
    pub fn bare_veth(
        label: &'static str,
        subnet_prefix: &str,
        big_tcp: Option<u32>,
    ) -> anyhow::Result<Self> {
        let a = Netns::named(&format!("fb-{label}-a"))?;
        let b = Netns::named(&format!("fb-{label}-b"))?;
        let ip_a = format!("{subnet_prefix}.1");
        let ip_b = format!("{subnet_prefix}.2");
        let (if_a, if_b) = ("fbveth-a", "fbveth-b");
        output(Command::new("ip").args([
            "link", "add", if_a, "netns", &a.name, "type", "veth", "peer", "name", if_b, "netns",
            &b.name,
        ]))?;
        for (ns, iface, ip) in [(&a, if_a, &ip_a), (&b, if_b, &ip_b)] {
            if let Some(size) = big_tcp {
                super::gso::set_limits(ns, iface, size)?;
            }
            output(&mut ns.command(&["ip", "addr", "add", &format!("{ip}/24"), "dev", iface]))?;
            output(&mut ns.command(&["ip", "link", "set", iface, "up"]))?;
        }
        let mut pair = Pair {
            label,
            a,
            b,
            ip_a,
            ip_b,
            host_veth_a: String::new(),
            plugin: None,
            servers: Vec::new(),
        };
        pair.start_servers()?;
        Ok(pair)
    }

    /// Two pods another process attached (the overlay bench's simulated
    /// nodes), named by their namespaces: servers started here, the
    /// namespaces deleted with the pair (the other process's DEL then finds
    /// them gone, as a runtime's late DEL may).
    pub fn existing(
        label: &'static str,
        (a, ip_a): (&str, &str),
        (b, ip_b): (&str, &str),
    ) -> anyhow::Result<Self> {
        let mut pair = Pair {
            label,
            a: Netns::adopt(a),
            b: Netns::adopt(b),
            ip_a: ip_a.to_string(),
            ip_b: ip_b.to_string(),
            host_veth_a: String::new(),
            plugin: None,
            servers: Vec::new(),
        };
        pair.start_servers()?;
        Ok(pair)
    }

    fn start_servers(&mut self) -> anyhow::Result<()> {
        let quiet = |mut cmd: Command| cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let iperf = pinned(
            SERVER_CPU,
            &["iperf3", "-s", "-B", &self.ip_b, "-p", IPERF_PORT],
        );
        self.servers
            .push(quiet(self.b.command(
                &iperf.iter().map(String::as_str).collect::<Vec<_>>(),
            ))?);
        // iperf3 prints nothing useful when ready; a short wait plus client retries do.
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    }

    /// Runs a client in pod a on `cpu`, retrying once (a server may still be starting).
    fn client(&self, cpu: usize, args: &[&str]) -> anyhow::Result<String> {
        let args = pinned(cpu, args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match output(&mut self.a.command(&args)) {
            Ok(out) => Ok(out),
            Err(_) => {
                std::thread::sleep(Duration::from_millis(500));
                Ok(output(&mut self.a.command(&args))?)
            }
        }
    }

    /// One TCP stream, a to b: Gbit/s received.
    pub fn tcp_throughput(&self, seconds: u32) -> anyhow::Result<f64> {
        let secs = seconds.to_string();
        let json: serde_json::Value = serde_json::from_str(&self.client(
            CLIENT_CPU,
            &[
                "iperf3", "-c", &self.ip_b, "-p", IPERF_PORT, "-t", &secs, "-J",
            ],
        )?)?;
        let bits = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .context("iperf3: no sum_received")?;
        Ok(bits / 1e9)
    }

    /// 64-byte UDP datagrams as fast as one sender can: thousands of packets/s received.
    pub fn udp_rate(&self, seconds: u32) -> anyhow::Result<f64> {
        let secs = seconds.to_string();
        let json: serde_json::Value = serde_json::from_str(&self.client(
            CLIENT_CPU,
            &[
                "iperf3", "-c", &self.ip_b, "-p", IPERF_PORT, "-u", "-l", "64", "-b", "0", "-t",
                &secs, "-J",
            ],
        )?)?;
        let sum = &json["end"]["sum"];
        let (packets, lost, elapsed) = (
            sum["packets"].as_f64(),
            sum["lost_packets"].as_f64(),
            sum["seconds"].as_f64(),
        );
        match (packets, lost, elapsed) {
            (Some(p), Some(l), Some(s)) if s > 0.0 => Ok((p - l) / s / 1e3),
            _ => bail!("iperf3 UDP: no packet counts in {sum}"),
        }
    }

    /// TCP ping-pong of 64-byte messages for `duration`: (p50, p99) round trip in µs.
    pub fn tcp_latency(&self, duration: Duration) -> anyhow::Result<(f64, f64)> {
        let ip: std::net::IpAddr = self.ip_b.parse().context("pod b's address")?;
        super::pingpong::round_trips(
            self.a.path(),
            self.b.path(),
            (ip, 0).into(),
            None,
            SERVER_CPU,
            duration,
        )
    }
}

/// The host-side interface a CNI result names (the one without a sandbox).
fn host_interface(result: &serde_json::Value) -> Option<String> {
    result["interfaces"]
        .as_array()?
        .iter()
        .find(|interface| interface.get("sandbox").is_none())?["name"]
        .as_str()
        .map(str::to_string)
}

impl Drop for Pair {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
        if let Some(plugin) = &self.plugin {
            for (netns, id) in [(&self.a, "a"), (&self.b, "b")] {
                if let Err(e) =
                    plugin.call("DEL", &format!("fb-{}-{id}", self.label), &netns.path())
                {
                    eprintln!("bench cleanup: {e}");
                }
            }
        }
    }
}

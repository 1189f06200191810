//! `cargo xtask bench`'s Services section: one connection to a ClusterIP
//! and a 64-byte request/response, over and over, with 10, 1,000 and
//! 10,000 Services installed, through flatnet's socket programs
//! (`--services ebpf`) and through kube-proxy's iptables-mode and
//! nftables-mode rules (the tests' `kube-proxy-fixture`, the same
//! Services); and the time to apply one EndpointSlice change: flatnet's
//! map update against an `iptables-restore` of the same rule set.
//!
//! Where: a flatnet network of two pods (the plugins of FLATNET_BIN_DIR).
//! kube-proxy's rules go into the client pod's own namespace (its nat
//! OUTPUT chain, which kube-proxy fills for a node's own processes), so
//! the client's connect() walks them exactly as on a node and the host's
//! tables are never touched; in that namespace the Service CIDR leads to a
//! sink in the pod, so a ClusterIP nothing rewrote goes nowhere. The measured Service sits in the middle of
//! kube-proxy's list. The client is a process of its own (this binary,
//! `--client`), in the bench's cgroup for flatnet's case. Each path has a
//! client pod of its own (rules set up once per Service count) and the
//! paths are measured in interleaved slices, medians reported.
//!
//! Then the same Service counts as NodePorts, reached from outside the
//! cluster (`nodeport/`).
//!
//! Usage: flatnet-services-bench <seconds> <count>... ; prints one JSON line.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use flatnet_datapath::bpf::{Outside, service_backend, service_key};
use flatnet_tests::ExchangeServer;
use flatnet_tests::Network;
use flatnet_tests::cgroup::TestCgroup;
use kube_proxy_fixture::{KubeProxy, Mode, Protocol, ServicePort};
use serde_json::{Value, json};

mod nodeport;

const PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
const MESSAGE: usize = 64;

/// ClusterIP number `i`: 10.96.0.0/16 holds 65,534.
fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, (1 + i / 250) as u8, (1 + i % 250) as u8)
}

/// Backends of the other Services: addresses no packet is sent to.
fn idle_backend(i: usize) -> SocketAddr {
    SocketAddr::from((
        Ipv4Addr::new(10, 250, (i / 250) as u8, (1 + i % 250) as u8),
        BACKEND_PORT,
    ))
}

/// `count` Services, the measured one (to `backend`) in the middle.
fn services(count: usize, backend: SocketAddr) -> (Vec<ServicePort>, Ipv4Addr) {
    let measured = count / 2;
    let ports = (0..count)
        .map(|i| {
            let target = if i == measured {
                backend
            } else {
                idle_backend(i)
            };
            let mut port = ServicePort::cluster_ip(
                &format!("svc-{i}"),
                IpAddr::V4(cluster_ip(i)),
                PORT,
                Protocol::Tcp,
                vec![target],
            );
            port.namespace = "bench".into();
            port
        })
        .collect();
    (ports, cluster_ip(measured))
}

fn kube_proxy(mode: Mode) -> KubeProxy {
    KubeProxy {
        mode,
        cluster_cidr_v4: "10.0.0.0/8".into(),
        cluster_cidr_v6: "fd00::/8".into(),
        service_cidr_v4: "10.96.0.0/16".into(),
        service_cidr_v6: "fd96::/108".into(),
        node_addresses: vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))],
    }
}

/// The client process: connections to `to` for `seconds`, each one
/// connect + 64 bytes each way + an abortive close (no TIME_WAIT piling
/// up). {"connections", "per_second", "p50_us", "p99_us"}.
fn client(
    cgroup: Option<&Path>,
    netns: &Path,
    to: SocketAddr,
    seconds: f64,
) -> anyhow::Result<Value> {
    if let Some(cgroup) = cgroup {
        std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())
            .context("joining the cgroup")?;
    }
    let namespace = std::fs::File::open(netns).context("the pod's netns")?;
    nix::sched::setns(namespace.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut buf = [7u8; MESSAGE];
    while Instant::now() < deadline {
        let begin = Instant::now();
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))
            .with_context(|| format!("connecting to {to}"))?;
        conn.set_nodelay(true)?;
        // A lost answer fails the run, rather than hang it.
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.write_all(&buf)?;
        conn.read_exact(&mut buf)
            .with_context(|| format!("reading the answer from {to}"))?;
        socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO))?;
        drop(conn);
        samples.push(begin.elapsed().as_secs_f64() * 1e6);
    }
    let elapsed = started.elapsed().as_secs_f64();
    ensure!(samples.len() > 10, "only {} connections", samples.len());
    let count = samples.len();
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((count - 1) as f64 * q) as usize];
    Ok(
        json!({"connections": count, "per_second": count as f64 / elapsed,
              "p50_us": at(0.5), "p99_us": at(0.99)}),
    )
}

/// Runs the client process and reads its line.
fn measure(
    cgroup: Option<&Path>,
    netns: &Path,
    to: SocketAddr,
    seconds: f64,
) -> anyhow::Result<Value> {
    let me = std::env::current_exe()?;
    let out = Command::new(me)
        .arg("--client")
        .arg(cgroup.map_or_else(|| PathBuf::from("-"), Path::to_path_buf))
        .arg(netns)
        .arg(to.to_string())
        .arg(seconds.to_string())
        .output()?;
    ensure!(
        out.status.success(),
        "the client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn flush_kube_proxy(netns: &str) {
    for args in [
        &["iptables", "-t", "nat", "-F"][..],
        &["iptables", "-t", "nat", "-X"],
        &["iptables", "-t", "filter", "-F"],
        &["iptables", "-t", "filter", "-X"],
        &["nft", "delete", "table", "ip", "kube-proxy"],
        &["nft", "delete", "table", "ip6", "kube-proxy"],
    ] {
        let _ = Command::new("ip")
            .args(["netns", "exec", netns])
            .args(args)
            .output();
    }
}

/// A client pod whose Service CIDR leads to a sink: a packet to a
/// ClusterIP that nothing rewrote dies there (out of a veth whose peer is in
/// the same namespace, which does not forward). The route lookup before
/// kube-proxy's OUTPUT DNAT still succeeds (a blackhole route would fail
/// connect() first), and nothing leaves for the node's default route. (No
/// dummy driver in this kernel.)
fn client_pod(net: &Network) -> flatnet_tests::Pod<'_> {
    let pod = net.pod();
    pod.netns.exec(&[
        "ip", "link", "add", "svcsink", "type", "veth", "peer", "name", "svcsink1",
    ]);
    pod.netns.exec(&["ip", "link", "set", "svcsink", "up"]);
    pod.netns.exec(&["ip", "link", "set", "svcsink1", "up"]);
    pod.netns
        .exec(&["ip", "route", "add", "10.96.0.0/16", "dev", "svcsink"]);
    pod
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Slices per path and Service count, taken in turn (this VM flips between
/// a fast and a slow state every few seconds; interleaved slices see both
/// alike). Each path reports the median of its slices.
const SLICES: usize = 5;

fn run(seconds: f64, counts: &[usize]) -> anyhow::Result<Value> {
    let net = Network::flatnet_ipam();
    // One client pod per path, each set up once per Service count: the
    // socket programs' cgroup, kube-proxy's iptables rules, its nftables
    // rules.
    let clients = [client_pod(&net), client_pod(&net), client_pod(&net)];
    let server_pod = net.pod();
    let _echo = ExchangeServer::start(&server_pod.netns, BACKEND_PORT, MESSAGE, 1);
    let backend = SocketAddr::from((server_pod.ip(), BACKEND_PORT));
    let datapath = net.datapath();
    let cgroup = TestCgroup::new("flatnet-bench-")?;
    datapath.attach_services(&cgroup.0)?;
    let paths: [(&str, Option<&Path>); 3] = [
        ("ebpf", Some(cgroup.0.as_path())),
        ("iptables", None),
        ("nftables", None),
    ];
    let slice = seconds / SLICES as f64;
    let mut rows = Vec::new();
    let mut updates = Vec::new();
    for &count in counts {
        let (ports, measured) = services(count, backend);
        let to = SocketAddr::from((measured, PORT));
        // flatnet: every Service in the maps (ids 1..=count).
        for (i, port) in ports.iter().enumerate() {
            let key = service_key(port.cluster_ip, PORT, 6);
            let backends: Vec<_> = port
                .endpoints
                .iter()
                .copied()
                .map(service_backend)
                .collect();
            datapath.put_service(&key, i as u32 + 1, &backends, 0, Outside::No)?;
        }
        let start = Instant::now();
        kube_proxy(Mode::Iptables)
            .apply(&clients[1].netns.name, &ports)
            .map_err(|e| anyhow::anyhow!("kube-proxy iptables rules: {e}"))?;
        let restore_us = start.elapsed().as_secs_f64() * 1e6;
        kube_proxy(Mode::Nftables)
            .apply(&clients[2].netns.name, &ports)
            .map_err(|e| anyhow::anyhow!("kube-proxy nftables rules: {e}"))?;
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut p50s: [Vec<f64>; 3] = Default::default();
        for _ in 0..SLICES {
            for (i, (_, cgroup)) in paths.iter().enumerate() {
                let seen = measure(*cgroup, &clients[i].netns.path(), to, slice)?;
                rates[i].push(seen["per_second"].as_f64().unwrap_or(f64::NAN));
                p50s[i].push(seen["p50_us"].as_f64().unwrap_or(f64::NAN));
            }
        }
        // One EndpointSlice change: the measured Service's set replaced.
        let key = service_key(IpAddr::V4(measured), PORT, 6);
        let start = Instant::now();
        datapath.put_service(
            &key,
            count as u32 + 1,
            &[service_backend(backend)],
            0,
            Outside::No,
        )?;
        let map_update_us = start.elapsed().as_secs_f64() * 1e6;
        for port in &ports {
            datapath.delete_service(&service_key(port.cluster_ip, PORT, 6))?;
        }
        flush_kube_proxy(&clients[1].netns.name);
        flush_kube_proxy(&clients[2].netns.name);
        let mut row = serde_json::Map::new();
        row.insert("services".into(), json!(count));
        for (i, (name, _)) in paths.iter().enumerate() {
            row.insert(
                name.to_string(),
                json!({"per_second": median(&mut rates[i]), "p50_us": median(&mut p50s[i]),
                       "slices": SLICES}),
            );
        }
        eprintln!(
            "{count} Services: {}; update: map {map_update_us:.0} us, iptables-restore {restore_us:.0} us",
            Value::Object(row.clone())
        );
        rows.push(Value::Object(row));
        updates.push(json!({"services": count, "map_update_us": map_update_us,
                            "iptables_restore_us": restore_us}));
    }
    datapath.detach_services()?;
    Ok(json!({"bench": "services", "seconds": seconds, "rows": rows, "updates": updates}))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A run ended by a signal (timeout, ^C) still removes its namespaces,
    // mounts and agents.
    flatnet_tests::remove_on_signal()?;
    if args.first().map(String::as_str) == Some("--client") {
        let [_, cgroup, netns, to, seconds] = args.as_slice() else {
            bail!("--client <cgroup|-> <netns> <address:port> <seconds>");
        };
        let cgroup = (cgroup != "-").then(|| PathBuf::from(cgroup));
        let line = client(
            cgroup.as_deref(),
            Path::new(netns),
            to.parse()?,
            seconds.parse()?,
        )?;
        println!("{line}");
        return Ok(());
    }
    let Some((seconds, counts)) = args.split_first() else {
        bail!("usage: flatnet-services-bench <seconds> <count>...");
    };
    let counts: Vec<usize> = counts.iter().map(|c| c.parse()).collect::<Result<_, _>>()?;
    let seconds: f64 = seconds.parse()?;
    let mut report = run(seconds, &counts)?;
    report["nodeport"] = nodeport::run(seconds, &counts)?;
    println!("{report}");
    Ok(())
}

//! `cargo xtask bench`'s overlay section: the topologies, held while xtask
//! measures them with the same clients as every other path. Three pairs of
//! pods, a pod on each of two simulated nodes on one underlay segment (the
//! tests' cluster: a switch namespace, the nodes' uplinks on its bridge):
//!
//! - `flatnet-vxlan`: flatnet's agent with `--routing vxlan` (every packet
//!   between the nodes in VXLAN, the fast path encapsulating);
//! - `flatnet-direct`: `--routing direct` (host-gw, the fast path routing);
//! - `flannel-vxlan`: the two nodes set up as flannel's vxlan backend sets
//!   up a node: the reference `bridge` plugin's `cni0` (gateway, hairpin,
//!   no ipMasq, as flannel's delegate conf), a kernel VXLAN device
//!   `flannel.1` (VNI 1, port 8472, `nolearning`, the node's address as
//!   `local`, MTU the uplink's less 50) holding the node's subnet's .0
//!   address, and per peer a route via the peer's .0 onlink, a permanent
//!   neighbour entry with the peer device's MAC and a permanent FDB entry
//!   sending that MAC to the peer's address; flanneld's iptables rules as
//!   its DaemonSet runs it (`--ip-masq`: the FLANNEL-POSTRTG masquerade
//!   chain, which puts the node's traffic under conntrack, and the
//!   FLANNEL-FWD accept chain); forwarding on; the host stack carries every
//!   packet.
//!
//! Prints one JSON line, `{"paths": [{"label", "a", "b", "ip_a", "ip_b"}]}`
//! (pod namespaces and addresses), then holds everything until its stdin
//! closes, and removes it all.
//!
//! Usage: flatnet-overlay-bench (FLATNET_BIN_DIR: flatnet's binaries)

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use flatnet_tests::cluster::{Cluster, NodeSpec, SimNode};
use flatnet_tests::{CniCall, Netns, REFERENCE_PLUGINS, run_ok};
use serde_json::{Value, json};

/// Two nodes on one segment.
fn two_nodes() -> Vec<NodeSpec> {
    Cluster::numbered(2, false)
}

/// A pod's namespace and IPv4 address, as the JSON line names them.
fn path(label: &str, a: (&Netns, String), b: (&Netns, String)) -> Value {
    json!({
        "label": label,
        "a": a.0.name,
        "b": b.0.name,
        "ip_a": a.1,
        "ip_b": b.1,
    })
}

/// Two nodes set up as flannel's vxlan backend does, one pod on each.
struct Flannel {
    cluster: Cluster,
    pods: Vec<(Netns, String)>,
    ipam_dir: PathBuf,
}

const FLANNEL_DEVICE: &str = "flannel.1";

impl Flannel {
    fn new() -> anyhow::Result<Self> {
        let specs = two_nodes();
        let cluster = Cluster::new(&specs);
        let ipam_dir = cluster.dir.join("flannel-ipam");
        let mut pods = Vec::new();
        for node in &cluster.nodes {
            flatnet_tests::forwarding::on_in(&node.netns);
            let address = node.spec.address().to_string();
            let subnet = subnet(node);
            node.netns.exec(&[
                "ip",
                "link",
                "add",
                FLANNEL_DEVICE,
                "type",
                "vxlan",
                "id",
                "1",
                "local",
                &address,
                "dev",
                "up0",
                "dstport",
                "8472",
                "nolearning",
            ]);
            node.netns
                .exec(&["ip", "link", "set", FLANNEL_DEVICE, "mtu", "1450", "up"]);
            node.netns.exec(&[
                "ip",
                "addr",
                "add",
                &format!("{subnet}.0/32"),
                "dev",
                FLANNEL_DEVICE,
            ]);
            flannel_rules(node, &subnet)?;
            pods.push(pod(node, &subnet, &ipam_dir)?);
        }
        for node in &cluster.nodes {
            for peer in cluster
                .nodes
                .iter()
                .filter(|p| p.spec.name != node.spec.name)
            {
                let gateway = format!("{}.0", subnet(peer));
                let mac = device_mac(&peer.netns)?;
                for command in [
                    format!(
                        "ip route add {}.0/24 via {gateway} dev {FLANNEL_DEVICE} onlink",
                        subnet(peer)
                    ),
                    format!(
                        "ip neigh add {gateway} lladdr {mac} dev {FLANNEL_DEVICE} nud permanent"
                    ),
                    format!(
                        "bridge fdb append {mac} dev {FLANNEL_DEVICE} dst {} self permanent",
                        peer.spec.address()
                    ),
                ] {
                    node.netns
                        .exec(&command.split_whitespace().collect::<Vec<_>>());
                }
            }
        }
        Ok(Flannel {
            cluster,
            pods,
            ipam_dir,
        })
    }
}

/// The network all flannel nodes' subnets are in.
const FLANNEL_NETWORK: &str = "10.245.0.0/16";

/// What flanneld (`--ip-masq`) puts in a node's iptables: its masquerade
/// chain, in the order flannel writes it, and its forward chain.
fn flannel_rules(node: &SimNode, subnet: &str) -> anyhow::Result<()> {
    let network = FLANNEL_NETWORK;
    let own = format!("{subnet}.0/24");
    let rules = format!(
        "*nat\n\
         :FLANNEL-POSTRTG - [0:0]\n\
         -A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n\
         -A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG -s {own} -d {network} -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG -s {network} -d {own} -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG ! -s {network} -d {own} -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG -s {network} ! -d 224.0.0.0/4 -m comment --comment \"flanneld masq\" -j MASQUERADE --random-fully\n\
         -A FLANNEL-POSTRTG ! -s {network} -d {network} -m comment --comment \"flanneld masq\" -j MASQUERADE --random-fully\n\
         COMMIT\n\
         *filter\n\
         :FLANNEL-FWD - [0:0]\n\
         -A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD\n\
         -A FLANNEL-FWD -s {network} -m comment --comment \"flanneld forward\" -j ACCEPT\n\
         -A FLANNEL-FWD -d {network} -m comment --comment \"flanneld forward\" -j ACCEPT\n\
         COMMIT\n"
    );
    let out = flatnet_tests::run_with_stdin(
        &mut node.netns.command(&["iptables-restore", "--noflush"]),
        rules.as_bytes(),
    );
    ensure!(
        out.success(),
        "flannel's rules on {}: {out:?}",
        node.spec.name
    );
    Ok(())
}

/// The first three octets of a flannel node's subnet (10.245.<index>.0/24).
fn subnet(node: &SimNode) -> String {
    format!("10.245.{}", node.spec.index)
}

/// The MAC of `netns`'s flannel device.
fn device_mac(netns: &Netns) -> anyhow::Result<String> {
    let shown: Value =
        serde_json::from_str(&netns.exec(&["ip", "-j", "link", "show", FLANNEL_DEVICE]))?;
    shown[0]["address"]
        .as_str()
        .map(str::to_string)
        .context("the flannel device's MAC")
}

/// The conf flannel's CNI plugin delegates to the bridge plugin.
fn bridge_conf(subnet: &str, ipam_dir: &Path) -> Vec<u8> {
    json!({
        "cniVersion": "1.0.0",
        "name": "cbr0",
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "isDefaultGateway": true,
        "hairpinMode": true,
        "ipMasq": false,
        "mtu": 1450,
        "ipam": {
            "type": "host-local",
            "subnet": format!("{subnet}.0/24"),
            "dataDir": ipam_dir,
        },
    })
    .to_string()
    .into_bytes()
}

/// A pod on a flannel node, attached by the reference bridge plugin run in
/// the node's namespace as its runtime would.
fn pod(node: &SimNode, subnet: &str, ipam_dir: &Path) -> anyhow::Result<(Netns, String)> {
    let netns = Netns::unique("fb-flannel-")?;
    let mut call = CniCall::new("ADD", &netns.name, &netns.path(), "eth0");
    call.path = REFERENCE_PLUGINS.to_string();
    call.node = Some(node.netns.path());
    let out = call.try_run(
        &Path::new(REFERENCE_PLUGINS).join("bridge"),
        &bridge_conf(subnet, ipam_dir),
    )?;
    ensure!(
        out.success(),
        "the bridge plugin's ADD on {}: {out:?}",
        node.spec.name
    );
    let ip = out.json()["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .context("the bridge plugin's address")?;
    Ok((netns, ip))
}

impl Drop for Flannel {
    fn drop(&mut self) {
        for (node, (netns, _)) in self.cluster.nodes.iter().zip(&self.pods) {
            let mut call = CniCall::new("DEL", &netns.name, &netns.path(), "eth0");
            call.path = REFERENCE_PLUGINS.to_string();
            call.node = Some(node.netns.path());
            let conf = bridge_conf(&subnet(node), &self.ipam_dir);
            if let Ok(out) = call.try_run(&Path::new(REFERENCE_PLUGINS).join("bridge"), &conf)
                && !out.success()
            {
                eprintln!("overlay bench: the bridge plugin's DEL: {out:?}");
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    // A run ended by a signal (timeout, ^C) still removes its namespaces,
    // mounts and agents.
    flatnet_tests::remove_on_signal()?;
    let vxlan = Cluster::started(&two_nodes(), &["--routing", "vxlan"]);
    let direct = Cluster::started(&two_nodes(), &["--routing", "direct"]);
    let flannel = Flannel::new()?;
    let (va, vb) = (vxlan.node("n1").pod(), vxlan.node("n2").pod());
    let (da, db) = (direct.node("n1").pod(), direct.node("n2").pod());
    let paths = vec![
        path(
            "flatnet-vxlan",
            (&va.netns, va.ip.to_string()),
            (&vb.netns, vb.ip.to_string()),
        ),
        path(
            "flatnet-direct",
            (&da.netns, da.ip.to_string()),
            (&db.netns, db.ip.to_string()),
        ),
        path(
            "flannel-vxlan",
            (&flannel.pods[0].0, flannel.pods[0].1.clone()),
            (&flannel.pods[1].0, flannel.pods[1].1.clone()),
        ),
    ];
    // The tunnel is up before anything is measured: one datagram each way
    // would not prove it; a ping does.
    for entry in &paths {
        let a = entry["a"].as_str().unwrap_or_default();
        let b_ip = entry["ip_b"].as_str().unwrap_or_default();
        run_ok(
            std::process::Command::new("ip")
                .args(["netns", "exec", a, "ping", "-c", "1", "-W", "2", b_ip]),
        );
    }
    println!("{}", json!({ "paths": paths }));
    let mut rest = Vec::new();
    std::io::stdin().read_to_end(&mut rest)?;
    drop((va, vb, da, db));
    drop(flannel);
    drop((vxlan, direct));
    Ok(())
}

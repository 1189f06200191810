//! `"ipMasq": true`: a namespace standing in for an outside host, on its
//! own veth from the node, sees the node's address; pods see each other's.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use flatnet_tests::*;
use serde_json::json;

/// Removes the network's nftables rules even when the test fails half way.
struct MasqGuard(String);

impl Drop for MasqGuard {
    fn drop(&mut self) {
        let _ = flatnet::masq::remove(&self.0);
    }
}

/// An "outside host": a namespace on a veth from the host, 172.30.X.0/24.
struct Outside {
    netns: Netns,
    host_side: String,
    prefix: String,
}

impl Outside {
    fn new() -> Self {
        let netns = Netns::new();
        let host_side = unique("fo");
        let prefix = format!("172.30.{}", std::process::id() % 250);
        run_ok(Command::new("ip").args([
            "link",
            "add",
            &host_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &netns.name,
        ]));
        run_ok(Command::new("ip").args([
            "addr",
            "add",
            &format!("{prefix}.1/24"),
            "dev",
            &host_side,
        ]));
        run_ok(Command::new("ip").args(["link", "set", &host_side, "up"]));
        netns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{prefix}.2/24"),
            "dev",
            "eth0",
        ]);
        netns.exec(&["ip", "link", "set", "eth0", "up"]);
        Outside {
            netns,
            host_side,
            prefix,
        }
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_side])
            .output();
    }
}

/// Connects from `client` to a server on `ip` in `server`; the address the
/// server saw the connection come from (after an echo both ways).
fn seen_from(server: &Netns, ip: IpAddr, client: &Netns) -> IpAddr {
    let listener = server.run(|| TcpListener::bind((ip, 0)).unwrap());
    let addr = listener.local_addr().unwrap();
    let accepted = std::thread::spawn(move || {
        let (mut conn, peer) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
        peer
    });
    client.run(|| {
        let mut conn =
            TcpStream::connect_timeout(&SocketAddr::new(ip, addr.port()), Duration::from_secs(5))
                .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello", "the reply did not come back");
    });
    accepted.join().unwrap().ip()
}

fn rules_of(network: &str) -> usize {
    let ruleset = run_ok(Command::new("nft").args(["list", "ruleset"]));
    ruleset.matches(&format!("\"flatnet:{network}\"")).count()
}

#[test]
fn masquerade_hides_pods_behind_the_node_but_not_from_each_other() {
    if !root_or_skip("masquerade_hides_pods_behind_the_node_but_not_from_each_other") {
        return;
    }
    let mut net = Network::host_local();
    net.conf["ipMasq"] = json!(true);
    let _rules = MasqGuard(net.name.clone());
    let outside = Outside::new();
    let a = net.pod();
    let b = net.pod();
    assert_eq!(
        rules_of(&net.name),
        1,
        "one rule per network, however many ADDs"
    );

    let node: IpAddr = format!("{}.1", outside.prefix).parse().unwrap();
    let far: IpAddr = format!("{}.2", outside.prefix).parse().unwrap();
    assert_eq!(
        seen_from(&outside.netns, far, &a.netns),
        node,
        "the outside host must see the node's address"
    );
    assert_eq!(
        seen_from(&b.netns, b.ip().into(), &a.netns),
        IpAddr::from(a.ip()),
        "pod to pod is not masqueraded"
    );

    drop(a);
    assert_eq!(rules_of(&net.name), 1, "the rule stays while pods remain");
    drop(b);
    assert_eq!(
        rules_of(&net.name),
        0,
        "the last DEL removes the network's rule"
    );
}

#[test]
fn without_ip_masq_nothing_is_installed() {
    if !root_or_skip("without_ip_masq_nothing_is_installed") {
        return;
    }
    let net = Network::host_local();
    let _pod = net.pod();
    assert_eq!(rules_of(&net.name), 0);
    assert!(!flatnet::masq::installed(&net.name));
}

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
        let _ = flatnet_datapath::masquerade::remove(&self.0);
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

#[flatnet_test(root)]
fn masquerade_hides_pods_behind_the_node_but_not_from_each_other() {
    let mut net = Network::host_local();
    net.conf["ipMasq"] = json!(true);
    let _rules = MasqGuard(net.name.clone());
    let outside = OutsideHost::new(None, &format!("172.30.{}", std::process::id() % 250));
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

#[flatnet_test(root)]
fn without_ip_masq_nothing_is_installed() {
    let net = Network::host_local();
    let _pod = net.pod();
    assert_eq!(rules_of(&net.name), 0);
    assert!(!flatnet_datapath::masquerade::installed(&net.name));
}

/// The nftables generation the agent's periodic re-check reads (it lists
/// its no-masquerade sets only when the generation moved): it moves with
/// any change to the namespace's tables, whoever makes it, and not with a
/// read.
#[flatnet_test(root)]
fn the_nftables_generation_moves_with_each_change_and_not_with_a_read() {
    use flatnet_datapath::nft_generation::nftables_generation;
    let netns = Netns::new();
    netns.run(|| {
        let before = nftables_generation().unwrap();
        run_ok(Command::new("nft").args(["-j", "list", "ruleset"]));
        assert_eq!(nftables_generation().unwrap(), before, "a read moved it");
        run_ok(Command::new("nft").args(["add", "table", "inet", "flatnet-generation"]));
        let added = nftables_generation().unwrap();
        assert_ne!(added, before, "adding a table did not move it");
        run_ok(Command::new("nft").args([
            "add",
            "set",
            "inet",
            "flatnet-generation",
            "s",
            "{ type ipv4_addr; flags interval; }",
        ]));
        run_ok(Command::new("nft").args([
            "add",
            "element",
            "inet",
            "flatnet-generation",
            "s",
            "{ 10.1.0.0/16 }",
        ]));
        let filled = nftables_generation().unwrap();
        assert_ne!(filled, added, "adding an element did not move it");
        run_ok(Command::new("nft").args(["flush", "set", "inet", "flatnet-generation", "s"]));
        assert_ne!(
            nftables_generation().unwrap(),
            filled,
            "flushing the set did not move it"
        );
    });
    // The table goes with the namespace.
}

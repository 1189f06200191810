//! BIG TCP (`bigTcp`): the GSO/GRO limits of both ends of a pod's veth
//! pair, read back over netlink, and TCP segments above 64 KiB crossing the
//! datapath, for IPv4 and IPv6; `"bigTcp": false` keeps the defaults.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};

use flatnet_datapath::netlink::{GsoLimits, Netlink};
use flatnet_tests::*;
use serde_json::json;

/// The kernel's largest GSO/GRO size (GSO_MAX_SIZE), what `bigTcp: true` sets.
const BIG: u32 = 524_280;
/// The kernel's default: the classic 64 KiB.
const DEFAULT: u32 = 65_536;

/// The GSO/GRO limits of `dev`, in `netns` or the host's namespace.
fn limits(netns: Option<&Netns>, dev: &str) -> GsoLimits {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let netlink = match netns {
            Some(ns) => {
                let file = File::open(ns.path()).expect("the pod's namespace");
                Netlink::connect_in(&file)
            }
            None => Netlink::connect(),
        }
        .expect("netlink");
        netlink
            .link_by_name(dev)
            .await
            .expect("reading the link")
            .unwrap_or_else(|| panic!("{dev} is missing"))
            .gso
    })
}

/// Sends `bytes` one way, from `client` to a reader at `ip` in `server`.
fn send_one_way(server: &Netns, ip: IpAddr, client: &Netns, bytes: usize) {
    let listener = server.run(|| TcpListener::bind((ip, 0)).expect("bind"));
    let addr = listener.local_addr().expect("the listener's address");
    let reader = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            match conn.read(&mut buf).expect("read") {
                0 => return total,
                n => total += n,
            }
        }
    });
    client.run(|| {
        let mut conn = TcpStream::connect(addr).expect("connect");
        let chunk = vec![0x42u8; 1 << 20];
        for _ in 0..bytes / chunk.len() {
            conn.write_all(&chunk).expect("write");
        }
    });
    assert_eq!(
        reader.join().expect("the reader"),
        bytes / (1 << 20) * (1 << 20)
    );
}

#[flatnet_test(root)]
fn big_tcp_raises_both_ends_and_segments_above_64k_cross_the_datapath() {
    for (setting, size) in [(None, BIG), (Some(false), DEFAULT)] {
        let mut net = Network::dual_stack("tc");
        if let Some(on) = setting {
            net.conf["bigTcp"] = json!(on);
        }
        let a = net.pod();
        let b = net.pod();
        for pod in [&a, &b] {
            for (side, found) in [
                ("host veth", limits(None, &pod.host_veth())),
                ("pod interface", limits(Some(&pod.netns), "eth0")),
            ] {
                for (name, value) in found.named() {
                    assert_eq!(value, Some(size), "bigTcp {setting:?}: {side} {name}");
                }
            }
        }
        for v6 in [false, true] {
            let family = if v6 { "IPv6" } else { "IPv4" };
            let slot = net
                .datapath()
                .endpoint(a.address(v6))
                .expect("the datapath")
                .expect("a's endpoint")
                .counter_slot;
            let before = net.datapath().slot_counters(slot).expect("a's counters");
            send_one_way(&b.netns, b.address(v6), &a.netns, 64 << 20);
            let after = net.datapath().slot_counters(slot).expect("a's counters");
            let (packets, bytes) = (
                after.tx_packets - before.tx_packets,
                after.tx_bytes - before.tx_bytes,
            );
            let per_packet = bytes / packets.max(1);
            eprintln!(
                "bigTcp {setting:?}, {family}: 64 MiB from a in {packets} packets, {per_packet} bytes per packet"
            );
            assert!(
                bytes >= 64 << 20,
                "{family}: the transfer left the datapath"
            );
            if size == BIG {
                assert!(
                    per_packet > u64::from(DEFAULT),
                    "{family}: {per_packet} bytes per packet with BIG TCP"
                );
            } else {
                assert!(
                    per_packet <= u64::from(DEFAULT),
                    "{family}: {per_packet} bytes per packet without BIG TCP"
                );
            }
        }
    }
}

/// CHECK holds the limits to the configuration, and a size of one's own
/// is applied as given.
#[flatnet_test(root)]
fn check_verifies_the_big_tcp_limits() {
    let mut net = Network::dual_stack("tc");
    net.conf["bigTcp"] = json!(196_608);
    let a = net.pod();
    assert_eq!(limits(None, &a.host_veth()).gso_max_size, Some(196_608));
    let check = || {
        CniCall::new("CHECK", &a.container_id, &a.netns.path(), &a.ifname)
            .run(&bin("flatnet"), &a.stdin_with_prev_result())
    };
    let out = check();
    assert!(out.success(), "CHECK of an untouched pod: {out:?}");
    let veth = a.host_veth();
    run_ok(std::process::Command::new("ip").args([
        "link",
        "set",
        "dev",
        &veth,
        "gso_max_size",
        "65536",
    ]));
    check().assert_error(102, "gso_max_size 65536");
}

//! The store on disk stays consistent: concurrent ADDs get distinct
//! addresses, SIGKILL in the middle of allocations corrupts nothing, and
//! corrupted or foreign files are reported and left untouched.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use flatnet_tests::*;
use serde_json::{Value, json};

use super::fixture::{address_of, subnet, with_key};

/// A tiny xorshift generator: no dependency, seed printed for reruns.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::env::var("FLATNET_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
                    ^ u64::from(std::process::id())
            })
            | 1;
        eprintln!("random seed: FLATNET_TEST_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a consistent store looks like: every address file is a readable
/// record of that address, held by a known attachment, hard-linked under its
/// attachment name, and an attachment holds at most one address per range set.
/// Returns (container ID, range set) -> address.
fn assert_consistent(net: &IpamNet, known: &HashSet<String>) -> HashMap<(String, u64), IpAddr> {
    let dir = net.store_dir();
    let mut held = HashMap::new();
    for name in net.allocations() {
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path).expect("record readable");
        let record: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("record {name} is torn ({e}): {text:?}"));
        assert_eq!(record["address"], name.as_str(), "{text}");
        let id = record["containerID"]
            .as_str()
            .expect("containerID")
            .to_string();
        assert!(
            known.contains(&id),
            "record {name} of unknown container {id}"
        );
        assert_eq!(record["ifname"], "eth0");
        let set = record["rangeSet"].as_u64().expect("rangeSet");
        let ip: IpAddr = name.parse().expect("address name");
        assert_eq!(ip.is_ipv6(), set == 1, "{name} in range set {set}");
        let links = std::fs::metadata(&path).expect("stat").nlink();
        assert_eq!(links, 2, "{name} is not linked under its attachment name");
        if let Some(other) = held.insert((id.clone(), set), ip) {
            panic!("{id} holds both {other} and {ip} in range set {set}");
        }
    }
    held
}

#[flatnet_test]
fn sixty_four_concurrent_adds_get_distinct_addresses_and_dels_empty_the_store() {
    let net = IpamNet::new("1.0.0", json!({"subnet": subnet(1)}));
    let plugin = bin("flatnet-ipam");
    let run_all = |command: &'static str| -> Vec<CniOutput> {
        let barrier = Arc::new(Barrier::new(64));
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..64)
                .map(|i| {
                    let barrier = Arc::clone(&barrier);
                    let (net, plugin) = (&net, &plugin);
                    scope.spawn(move || {
                        let call = net.cni_call(command, &format!("ctr-{i}"), "eth0");
                        let stdin = net.stdin();
                        barrier.wait();
                        call.run(plugin, &stdin)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        })
    };
    let adds = run_all("ADD");
    let mut addresses = HashSet::new();
    for out in &adds {
        assert!(out.success(), "{out:?}");
        assert!(
            addresses.insert(address_of(&out.json(), 0)),
            "duplicate: {out:?}"
        );
    }
    assert_eq!(addresses.len(), 64);
    assert_eq!(net.allocations().len(), 64);
    let known: HashSet<String> = (0..64).map(|i| format!("ctr-{i}")).collect();
    assert_consistent(&net, &known);

    for out in run_all("DEL") {
        assert!(out.success(), "{out:?}");
    }
    assert!(net.allocations().is_empty(), "{:?}", net.allocations());
    let left: Vec<String> = net
        .names()
        .into_iter()
        .filter(|n| n != "lock" && !n.starts_with("last_reserved."))
        .collect();
    assert!(left.is_empty(), "left in the store: {left:?}");
}

#[flatnet_test]
fn sigkill_in_the_middle_of_allocations_never_corrupts_the_store() {
    // Dual stack: a kill can also fall between the two addresses of one ADD.
    let net = IpamNet::new(
        "1.0.0",
        json!({"ranges": [[{"subnet": "10.251.8.0/22"}], [{"subnet": "fd00:251::/116"}]]}),
    );
    let plugin = bin("flatnet-ipam");
    let stdin = net.stdin();
    let mut rng = Rng::new();
    let mut started = HashSet::new();
    // Attachments whose last call completed ADD: what it answered.
    let mut answered: HashMap<String, (IpAddr, IpAddr)> = HashMap::new();
    let (mut killed, mut completed, mut leftovers) = (0, 0, 0);
    // Kill times are drawn within how long a round takes on this machine
    // (round 0 kills nothing and measures it), so kills land mid-call.
    let mut span = Duration::ZERO;
    for round in 0..50 {
        let mut calls = Vec::new();
        for i in 0..12 {
            let id = format!("r{round}-{i}");
            started.insert(id.clone());
            calls.push(("ADD", id));
        }
        // DELs of earlier attachments, killed just as often.
        let earlier: Vec<String> = answered.keys().cloned().collect();
        for _ in 0..4.min(earlier.len()) {
            let id = earlier[rng.below(earlier.len() as u64) as usize].clone();
            if !calls.iter().any(|(_, c)| *c == id) {
                calls.push(("DEL", id));
            }
        }
        let round_start = Instant::now();
        let mut children: Vec<_> = calls
            .iter()
            .map(|(command, id)| {
                // Their state is unknown until a call completes again.
                answered.remove(id);
                net.cni_call(command, id, "eth0").spawn(&plugin, &stdin)
            })
            .collect();
        // Kill about half, each at a random point of its short life.
        let mut kills: Vec<(Duration, usize)> = Vec::new();
        for i in 0..children.len() {
            if round > 0 && rng.below(2) == 0 {
                let at = rng.below(span.as_micros().max(1) as u64);
                kills.push((Duration::from_micros(at), i));
            }
        }
        kills.sort();
        for (at, index) in kills {
            if let Some(wait) = at.checked_sub(round_start.elapsed()) {
                // Kills at chosen moments of the round: the timing is the test.
                std::thread::sleep(wait);
            }
            let _ = children[index].kill();
        }
        for (child, (command, id)) in children.drain(..).zip(&calls) {
            let out = child.wait_with_output().expect("wait");
            if out.status.signal() == Some(9) {
                killed += 1;
                continue;
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            // Evidence that kills landed inside the store: what the next process tidied.
            leftovers += String::from_utf8_lossy(&out.stderr)
                .matches("left by a killed process")
                .count();
            assert!(
                out.status.success(),
                "{command} {id}: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            completed += 1;
            if *command == "ADD" {
                let result: Value = serde_json::from_str(&stdout).expect("ADD result");
                answered.insert(id.clone(), (address_of(&result, 0), address_of(&result, 1)));
            }
        }
        if round == 0 {
            span = round_start.elapsed();
        }
    }
    eprintln!(
        "{killed} calls killed, {completed} completed; leftovers of kills inside the store tidied up: {leftovers}"
    );
    assert!(
        killed > 50 && completed > 50,
        "{killed} killed, {completed} completed"
    );

    // As the kills left it: readable records, one address per attachment and set.
    let held = assert_consistent(&net, &started);
    // Every completed ADD not touched since is on disk exactly as answered.
    for (id, (v4, v6)) in &answered {
        assert_eq!(held.get(&(id.clone(), 0)), Some(v4), "{id}");
        assert_eq!(held.get(&(id.clone(), 1)), Some(v6), "{id}");
    }
    let stale = net
        .names()
        .iter()
        .filter(|n| n.starts_with(".tmp-") || n.starts_with("attachment."))
        .count();
    eprintln!(
        "{} records, {stale} attachment/temp names before the next ADD",
        held.len()
    );

    // The next ADD works, avoids every held address, and tidies the leftovers.
    started.insert("after".into());
    let out = net.call("ADD", "after", "eth0");
    assert!(out.success(), "{out:?}");
    let after = out.json();
    for ip in [address_of(&after, 0), address_of(&after, 1)] {
        assert!(!held.values().any(|h| *h == ip), "{ip} handed out twice");
    }
    assert!(!net.names().iter().any(|n| n.starts_with(".tmp-")));
    assert_consistent(&net, &started);

    // Every attachment can finish its ADD (the same addresses) and be deleted.
    for id in &started {
        let out = net.call("ADD", id, "eth0");
        assert!(out.success(), "{out:?}");
        let result = out.json();
        for set in 0..2u64 {
            if let Some(ip) = held.get(&(id.clone(), set)) {
                assert_eq!(address_of(&result, set as usize), *ip, "{id} moved");
            }
        }
    }
    let all = assert_consistent(&net, &started);
    assert_eq!(all.len(), started.len() * 2);
    for id in &started {
        let out = net.call("DEL", id, "eth0");
        assert!(out.success(), "{out:?}");
    }
    assert!(net.allocations().is_empty(), "{:?}", net.allocations());
    assert!(
        !net.names().iter().any(|n| n.starts_with("attachment.")),
        "{:?}",
        net.names()
    );
}

#[flatnet_test]
fn corrupted_and_foreign_files_are_reported_and_left_untouched() {
    let net = IpamNet::new("1.1.0", json!({"subnet": subnet(10)}));
    assert!(net.call("ADD", "a", "eth0").success());
    let dir = net.store_dir();
    // A garbage file where the next address would go, and a stray file.
    std::fs::write(dir.join("10.251.10.3"), "{garbage").unwrap();
    std::fs::write(dir.join("README"), "notes").unwrap();
    let out = net.call("ADD", "b", "eth0");
    assert!(out.success(), "{out:?}");
    assert_eq!(
        out.json()["ips"][0]["address"],
        "10.251.10.4/24",
        "the garbage's address is skipped"
    );
    assert!(
        out.stderr
            .contains("10.251.10.3 is not a flatnet-ipam record"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("\"README\""), "{}", out.stderr);

    // A's record torn in place (what a power loss can do to an unflushed record).
    std::fs::write(dir.join("10.251.10.2"), "").unwrap();
    let stdin = with_key(&net.conf, "cni.dev/valid-attachments", json!([]));
    let out = CniCall::new("GC", "", Path::new(""), "").run(&bin("flatnet-ipam"), &stdin);
    assert!(out.success(), "{out:?}");
    assert!(
        out.stderr.contains("record of 10.251.10.2 is unreadable"),
        "{}",
        out.stderr
    );
    assert_eq!(
        net.allocations(),
        vec!["10.251.10.2", "10.251.10.3"],
        "b released, the rest kept"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("10.251.10.3")).unwrap(),
        "{garbage"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("10.251.10.2")).unwrap(),
        ""
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("README")).unwrap(),
        "notes"
    );
    // Nobody gets those addresses.
    let out = net.call("ADD", "c", "eth0");
    assert_eq!(out.json()["ips"][0]["address"], "10.251.10.5/24");
}

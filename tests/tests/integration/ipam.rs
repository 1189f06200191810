//! flatnet-ipam as a runtime (or a delegating plugin) drives it: env + stdin
//! in, JSON out, the store on disk read back. Concurrency and SIGKILL
//! torture, the protocol's corners, and interop with the reference bridge
//! plugin and with flatnet.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use flatnet_tests::*;
use serde_json::{Value, json};

/// A /24 of its own for each test (the store does not care, people reading logs do).
fn subnet(third: u8) -> String {
    format!("10.251.{third}.0/24")
}

fn address_of(result: &Value, index: usize) -> IpAddr {
    let text = result["ips"][index]["address"].as_str().expect("address");
    text.split('/')
        .next()
        .and_then(|ip| ip.parse().ok())
        .expect("an IP")
}

fn with_key(conf: &Value, key: &str, value: Value) -> Vec<u8> {
    let mut conf = conf.clone();
    conf[key] = value;
    conf.to_string().into_bytes()
}

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
fn a_repeated_add_returns_the_same_address_and_del_is_idempotent() {
    let net = IpamNet::new(
        "1.0.0",
        json!({"subnet": subnet(2), "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.251.2.53"]}}),
    );
    let first = net.call("ADD", "a", "eth0");
    assert!(first.success(), "{first:?}");
    let result = first.json();
    assert_eq!(result["cniVersion"], "1.0.0");
    assert_eq!(result["ips"][0]["address"], "10.251.2.2/24");
    assert_eq!(result["ips"][0]["gateway"], "10.251.2.1");
    assert_eq!(result["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(result["dns"]["nameservers"][0], "10.251.2.53");
    assert!(result.get("interfaces").is_none(), "{result}");
    let again = net.call("ADD", "a", "eth0");
    assert_eq!(again.json(), result);
    assert_eq!(net.allocations(), vec!["10.251.2.2"]);
    // Another interface of the same container is another attachment.
    let eth1 = net.call("ADD", "a", "eth1");
    assert_eq!(address_of(&eth1.json(), 0).to_string(), "10.251.2.3");

    for _ in 0..2 {
        let out = net.call("DEL", "a", "eth0");
        assert!(out.success(), "{out:?}");
        assert!(out.stdout.trim().is_empty(), "{out:?}");
    }
    assert_eq!(
        net.allocations(),
        vec!["10.251.2.3"],
        "only eth0's address is released"
    );
    let out = net.call("DEL", "never-added", "eth0");
    assert!(out.success(), "{out:?}");
    // DEL (and GC, STATUS) on a network that never allocated leave no store behind.
    let fresh = IpamNet::new("1.0.0", json!({"subnet": subnet(2)}));
    let out = fresh.call("DEL", "a", "eth0");
    assert!(out.success(), "{out:?}");
    assert!(!fresh.data_dir.exists());
    // The walk goes on: the address just released is not reused at once.
    let next = net.call("ADD", "b", "eth0");
    assert_eq!(address_of(&next.json(), 0).to_string(), "10.251.2.4");
}

#[flatnet_test]
fn requested_addresses_are_honoured_when_free_and_refused_when_taken() {
    let net = IpamNet::new(
        "1.0.0",
        json!({"subnet": subnet(3), "exclude": ["10.251.3.100"]}),
    );
    let mut call = net.cni_call("ADD", "a", "eth0");
    call.args = "IgnoreUnknown=1;IP=10.251.3.77".into();
    let out = call.run(&bin("flatnet-ipam"), &net.stdin());
    assert!(out.success(), "{out:?}");
    assert_eq!(out.json()["ips"][0]["address"], "10.251.3.77/24");

    let mut call = net.cni_call("ADD", "b", "eth0");
    call.args = "IP=10.251.3.77".into();
    call.run(&bin("flatnet-ipam"), &net.stdin()).assert_error(
        111,
        "10.251.3.77 is already allocated to container a (eth0)",
    );
    assert_eq!(net.allocations(), vec!["10.251.3.77"]);

    // args.cni.ips in the configuration, as a runtime passes it.
    let stdin = with_key(&net.conf, "args", json!({"cni": {"ips": ["10.251.3.78"]}}));
    let out = net
        .cni_call("ADD", "b", "eth0")
        .run(&bin("flatnet-ipam"), &stdin);
    assert!(out.success(), "{out:?}");
    assert_eq!(out.json()["ips"][0]["address"], "10.251.3.78/24");
    let stdin = with_key(&net.conf, "args", json!({"cni": {"ips": ["10.251.3.78"]}}));
    net.cni_call("ADD", "c", "eth0")
        .run(&bin("flatnet-ipam"), &stdin)
        .assert_error(111, "already allocated to container b (eth0)");

    for (ip, code, needle) in [
        ("10.251.3.100", 7, "excluded"),
        ("10.251.3.1", 7, "gateway"),
        ("10.251.3.255", 7, "broadcast"),
        ("10.9.9.9", 7, "not inside any configured range"),
        ("banana", 4, "CNI_ARGS"),
    ] {
        let mut call = net.cni_call("ADD", "c", "eth0");
        call.args = format!("IP={ip}");
        call.run(&bin("flatnet-ipam"), &net.stdin())
            .assert_error(code, needle);
    }
    assert_eq!(net.allocations(), vec!["10.251.3.77", "10.251.3.78"]);
}

#[flatnet_test]
fn a_full_pool_names_the_range_and_how_many_addresses_it_has() {
    let net = IpamNet::new(
        "1.0.0",
        json!({"subnet": "10.251.4.0/29", "rangeStart": "10.251.4.4"}),
    );
    for id in ["a", "b", "c"] {
        let out = net.call("ADD", id, "eth0");
        assert!(out.success(), "{out:?}");
    }
    net.call("ADD", "d", "eth0").assert_error(
        110,
        "no free address in range set 0 [10.251.4.0/29 (10.251.4.4-10.251.4.6)]: all 3 addresses",
    );
    assert_eq!(net.allocations().len(), 3);
}

#[flatnet_test]
fn invalid_configs_get_code_7_naming_the_field_and_touch_nothing() {
    let cases: Vec<(Value, u64, &str)> = vec![
        (json!({"subnet": "10.251.5.0/33"}), 7, "ipam.subnet"),
        (
            json!({"subnet": "10.251.5.0/24", "gateway": "10.251.6.1"}),
            7,
            "ipam.gateway: 10.251.6.1 is outside the subnet",
        ),
        (
            json!({"subnet": "10.251.5.0/24", "rangeStart": "10.251.5.200", "rangeEnd": "10.251.5.100"}),
            7,
            "ipam.rangeStart: 10.251.5.200 is after rangeEnd 10.251.5.100",
        ),
        (
            json!({"ranges": [[{"subnet": "fd00::/64", "rangeStart": "10.0.0.5"}]]}),
            7,
            "ipam.ranges[0][0].rangeStart: 10.0.0.5 is IPv4",
        ),
        (
            json!({"ranges": [[{"subnet": "10.251.5.0/24"}, {"subnet": "10.251.5.0/25", "rangeStart": "10.251.5.10"}]]}),
            7,
            "ipam.ranges[0][1]: 10.251.5.10-10.251.5.126 overlaps ipam.ranges[0][0]",
        ),
        (
            json!({"ranges": [[{"subnet": "10.251.5.0/24"}, {"subnet": "fd00::/64"}]]}),
            7,
            "ipam.ranges[0][1].subnet",
        ),
        (
            json!({"subnet": "10.251.5.0/24", "exclude": ["nope"]}),
            7,
            "ipam.exclude[0]",
        ),
        (
            json!({"subnet": "10.251.5.0/24", "routes": [{"dst": "10.0.0.0"}]}),
            7,
            "ipam.routes[0].dst",
        ),
        (json!({}), 7, "give \"subnet\""),
        (
            json!({"subnet": "10.251.5.0/24", "rangestart": "10.251.5.9"}),
            2,
            "ipam.rangestart",
        ),
    ];
    for (ipam, code, needle) in cases {
        let net = IpamNet::new("1.0.0", ipam.clone());
        let out = net.call("ADD", "a", "eth0");
        out.assert_error(code, needle);
        assert_eq!(
            out.json()["cniVersion"],
            "1.0.0",
            "error in the config's version"
        );
        assert!(!net.data_dir.exists(), "{ipam}: the data dir was created");
    }
}

#[flatnet_test]
fn dual_stack_gives_one_address_per_family_in_every_version() {
    let net = IpamNet::new(
        "0.4.0",
        json!({"ranges": [[{"subnet": subnet(6)}], [{"subnet": "fd00:251:6::/64", "gateway": "fd00:251:6::fe"}]]}),
    );
    let out = net.call("ADD", "a", "eth0");
    assert!(out.success(), "{out:?}");
    let result = out.json();
    assert_eq!(result["ips"][0]["version"], "4");
    assert_eq!(result["ips"][0]["address"], "10.251.6.2/24");
    assert_eq!(result["ips"][1]["version"], "6");
    assert_eq!(result["ips"][1]["address"], "fd00:251:6::1/64");
    assert_eq!(result["ips"][1]["gateway"], "fd00:251:6::fe");
    assert_eq!(net.allocations(), vec!["10.251.6.2", "fd00:251:6::1"]);
}

#[flatnet_test]
fn check_verifies_the_attachment_holds_its_addresses() {
    let net = IpamNet::new("1.0.0", json!({"subnet": subnet(7)}));
    let result = net.call("ADD", "a", "eth0").json();
    let stdin = with_key(&net.conf, "prevResult", result.clone());
    let out = net
        .cni_call("CHECK", "a", "eth0")
        .run(&bin("flatnet-ipam"), &stdin);
    assert!(out.success(), "{out:?}");
    net.cni_call("CHECK", "b", "eth0")
        .run(&bin("flatnet-ipam"), &stdin)
        .assert_error(102, "container b (eth0) holds no address");
    let mut wrong = result;
    wrong["ips"][0]["address"] = json!("10.251.7.99/24");
    let stdin = with_key(&net.conf, "prevResult", wrong);
    net.cni_call("CHECK", "a", "eth0")
        .run(&bin("flatnet-ipam"), &stdin)
        .assert_error(102, "prevResult has 10.251.7.99");
}

#[flatnet_test]
fn gc_and_status_with_cni_1_1_0() {
    let net = IpamNet::new("1.1.0", json!({"subnet": "10.251.9.0/29"}));
    let plugin = bin("flatnet-ipam");
    let status = || CniCall::new("STATUS", "", Path::new(""), "").run(&plugin, &net.stdin());
    let gc = |valid: Value| {
        let stdin = with_key(&net.conf, "cni.dev/valid-attachments", valid);
        CniCall::new("GC", "", Path::new(""), "").run(&plugin, &stdin)
    };
    assert!(status().success(), "{:?}", status());
    for id in ["a", "b", "c", "d", "e"] {
        assert!(net.call("ADD", id, "eth0").success());
    }
    status().assert_error(
        50,
        "range set 0 [10.251.9.0/29 (10.251.9.1-10.251.9.6)] is full: all 5 addresses",
    );
    // Without the list (a caller that forgot it) nothing is released.
    CniCall::new("GC", "", Path::new(""), "")
        .run(&plugin, &net.stdin())
        .assert_error(7, "GC needs \"cni.dev/valid-attachments\"");
    assert_eq!(net.allocations().len(), 5);
    let out = gc(
        json!([{"containerID": "a", "ifname": "eth0"}, {"containerID": "c", "ifname": "eth0"}, {"containerID": "zz", "ifname": "eth0"}]),
    );
    assert!(out.success(), "{out:?}");
    assert_eq!(net.allocations(), vec!["10.251.9.2", "10.251.9.4"]);
    assert!(status().success());
    // What survived GC is still its attachment's.
    assert_eq!(
        net.call("ADD", "a", "eth0").json()["ips"][0]["address"],
        "10.251.9.2/29"
    );
    let out = gc(json!([]));
    assert!(out.success(), "{out:?}");
    assert!(net.allocations().is_empty());

    // STATUS and GC do not exist before 1.1.0.
    let old = with_key(&net.conf, "cniVersion", json!("1.0.0"));
    CniCall::new("STATUS", "", Path::new(""), "")
        .run(&plugin, &old)
        .assert_error(1, "STATUS only from cniVersion 1.1.0 on (1.1.0)");
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

#[flatnet_test]
fn version_answers_like_flatnet() {
    let call = CniCall {
        command: "VERSION".into(),
        ..Default::default()
    };
    let out = call.run(&bin("flatnet-ipam"), br#"{"cniVersion":"0.4.0"}"#);
    assert!(out.success(), "{out:?}");
    assert_eq!(out.json()["cniVersion"], "0.4.0");
    assert_eq!(
        out.json()["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}

/// A pod attached by the reference bridge plugin; DEL on drop.
struct BridgePod<'a> {
    net: &'a Network,
    netns: Netns,
    id: String,
    ip: std::net::Ipv4Addr,
}

impl<'a> BridgePod<'a> {
    fn add(net: &'a Network) -> Self {
        let netns = Netns::new();
        let id = unique("br-");
        let out = CniCall::new("ADD", &id, &netns.path(), "eth0")
            .run(Path::new("/usr/lib/cni/bridge"), &net.stdin());
        // Built before asserting, so a failed ADD is still deleted on drop.
        let ip = out
            .json()
            .get("ips")
            .map(|_| match address_of(&out.json(), 0) {
                IpAddr::V4(v4) => v4,
                IpAddr::V6(_) => panic!("IPv6 from an IPv4 config"),
            })
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
        let pod = BridgePod { net, netns, id, ip };
        assert!(out.success(), "bridge ADD failed: {out:?}");
        pod
    }
}

impl Drop for BridgePod<'_> {
    fn drop(&mut self) {
        let out = CniCall::new("DEL", &self.id, &self.netns.path(), "eth0")
            .run(Path::new("/usr/lib/cni/bridge"), &self.net.stdin());
        if !out.success() {
            eprintln!("cleanup DEL of {} failed: {out:?}", self.id);
        }
    }
}

#[flatnet_test(root)]
fn the_reference_bridge_plugin_delegating_to_flatnet_ipam_gives_pods_that_talk() {
    let mut net = Network::with_ipam(
        |subnet, gateway, dir| json!({"type": "flatnet-ipam", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
    );
    // Network's drop deletes `bridge` (the reference plugin's bridge here) and the data dir.
    net.conf["type"] = json!("bridge");
    net.conf["isGateway"] = json!(true);
    let a = BridgePod::add(&net);
    let b = BridgePod::add(&net);
    assert_ne!(a.ip, b.ip);
    assert_eq!(net.ipam_allocations().len(), 2);
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("a -> b");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), 1 << 20).expect("b -> a");
    // The gateway the bridge plugin put on its bridge came from flatnet-ipam's result.
    let addrs = run_ok(std::process::Command::new("ip").args([
        "-o",
        "addr",
        "show",
        "dev",
        &net.gateway_device,
    ]));
    assert!(addrs.contains(&format!("{}/24", net.gateway())), "{addrs}");
    drop((a, b));
    assert!(
        net.ipam_allocations().is_empty(),
        "bridge DEL released nothing"
    );
}

#[flatnet_test(root)]
fn flatnet_with_flatnet_ipam_gives_pods_that_talk() {
    let net = Network::with_ipam(
        |subnet, gateway, dir| json!({"type": "flatnet-ipam", "subnet": subnet, "gateway": gateway, "dataDir": dir}),
    );
    let a = net.pod();
    let b = net.pod();
    assert_ne!(a.ip(), b.ip());
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 1 << 20).expect("a -> b");
    tcp_echo(Some(&a.netns), a.ip(), Some(&b.netns), 1 << 20).expect("b -> a");
    let mut allocated = net.ipam_allocations();
    allocated.sort();
    let mut expect = vec![a.ip().to_string(), b.ip().to_string()];
    expect.sort();
    assert_eq!(allocated, expect);
    let check = CniCall::new("CHECK", &a.container_id, &a.netns.path(), &a.ifname)
        .run(&bin("flatnet"), &a.stdin_with_prev_result());
    assert!(check.success(), "{check:?}");
    drop((a, b));
    assert!(
        net.ipam_allocations().is_empty(),
        "flatnet DEL released nothing"
    );
}

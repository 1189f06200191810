//! What an ADD gets: the same address when repeated (DEL idempotent),
//! requested addresses when free, a full pool named with its size, and one
//! address per family on a dual-stack network.

use flatnet_tests::*;
use serde_json::json;

use super::fixture::{address_of, subnet, with_key};

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

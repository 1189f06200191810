//! The protocol's other corners: invalid configs get code 7 naming the
//! field, CHECK verifies an attachment's addresses, GC and STATUS on CNI
//! 1.1.0, and VERSION answers as flatnet does.

use std::path::Path;

use flatnet_tests::*;
use serde_json::{Value, json};

use super::fixture::{subnet, with_key};

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

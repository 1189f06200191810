//! Hostile stdin: input that does not decode or has the wrong shape, a
//! configuration with a bad field (IPAM, prevResult, MTU, runtimeConfig,
//! names, cniVersion), 10 MB of it, and flatnet-ipam's share of the same.

use flatnet_tests::*;
use serde_json::json;

use super::case::{Case, case, with};

/// Stdin that is empty, not JSON, or JSON of the wrong shape.
pub(super) fn decoding(net: &Network) -> Vec<Case> {
    let conf = &net.conf;
    vec![
        case("empty stdin", vec![], Vec::new(), 6, "stdin is empty"),
        case(
            "blank stdin",
            vec![],
            b" \n\t ".to_vec(),
            6,
            "stdin is empty",
        ),
        case(
            "not JSON",
            vec![],
            b"{not json".to_vec(),
            6,
            "cannot decode network configuration",
        ),
        case(
            "binary garbage",
            vec![],
            vec![0xff, 0xfe, 0, 1, 2],
            6,
            "cannot decode",
        ),
        case(
            "a JSON array",
            vec![],
            b"[1,2,3]".to_vec(),
            6,
            "must be a JSON object",
        ),
        case(
            "a JSON string",
            vec![],
            b"\"flatnet\"".to_vec(),
            6,
            "must be a JSON object",
        ),
        case(
            "name is a number",
            vec![],
            with(conf, "name", json!(5)),
            6,
            "cannot decode",
        ),
        case(
            "dns is a string",
            vec![],
            with(conf, "dns", json!("1.1.1.1")),
            6,
            "cannot decode",
        ),
        case(
            "ipam is a string",
            vec![],
            with(conf, "ipam", json!("flatnet-ipam")),
            7,
            "\"ipam\" must be an object",
        ),
    ]
}

/// A configuration with one bad field.
pub(super) fn configuration(net: &Network) -> Vec<Case> {
    let conf = &net.conf;
    vec![
        case(
            "IPAM type not in CNI_PATH",
            vec![],
            with(conf, "ipam", json!({"type": "no-such-ipam"})),
            7,
            "no-such-ipam",
        ),
        case(
            "IPAM type is a path",
            vec![],
            with(conf, "ipam", json!({"type": "../../bin/sh"})),
            7,
            "ipam.type",
        ),
        case(
            "IPAM type missing",
            vec![],
            with(conf, "ipam", json!({"subnet": "10.0.0.0/8"})),
            7,
            "ipam.type",
        ),
        case(
            "prevResult of the wrong shape",
            vec![],
            with(conf, "prevResult", json!({"ips": "x"})),
            6,
            "prevResult",
        ),
        case(
            "prevResult with a bad address",
            vec![],
            with(
                conf,
                "prevResult",
                json!({"ips": [{"address": "10.0.0.300/8"}]}),
            ),
            6,
            "prevResult",
        ),
        case(
            "prevResult with a dangling interface",
            vec![],
            with(
                conf,
                "prevResult",
                json!({"interfaces": [{"name": "a"}], "ips": [{"address": "10.0.0.1/8", "interface": 7}]}),
            ),
            6,
            "interface 7",
        ),
        case(
            "prevResult of an unknown version",
            vec![],
            with(conf, "prevResult", json!({"cniVersion": "9.9.9"})),
            1,
            "9.9.9",
        ),
        case(
            "prevResult is a string",
            vec![],
            with(conf, "prevResult", json!("{}")),
            6,
            "prevResult",
        ),
        case(
            "MTU too small",
            vec![],
            with(conf, "mtu", json!(67)),
            7,
            "\"mtu\" 67 is out of range",
        ),
        case(
            "MTU too large",
            vec![],
            with(conf, "mtu", json!(65536)),
            7,
            "\"mtu\" 65536 is out of range",
        ),
        case(
            "MTU negative",
            vec![],
            with(conf, "mtu", json!(-1500)),
            6,
            "cannot decode",
        ),
        case(
            "runtimeConfig MTU out of range",
            vec![],
            with(conf, "runtimeConfig", json!({"mtu": 20})),
            7,
            "runtimeConfig.mtu",
        ),
        case(
            "runtimeConfig MAC malformed",
            vec![],
            with(conf, "runtimeConfig", json!({"mac": "02:00:00:00:00"})),
            7,
            "runtimeConfig.mac",
        ),
        case(
            "runtimeConfig MAC multicast",
            vec![],
            with(conf, "runtimeConfig", json!({"mac": "01:00:5e:00:00:01"})),
            7,
            "multicast",
        ),
        case(
            "network name with a space",
            vec![],
            with(conf, "name", json!("bad name")),
            7,
            "not a valid network name",
        ),
        case(
            "network name with a slash",
            vec![],
            with(conf, "name", json!("../etc")),
            7,
            "not a valid network name",
        ),
        case(
            "network name starting with a dash",
            vec![],
            with(conf, "name", json!("-net")),
            7,
            "not a valid network name",
        ),
        case(
            "network name too long",
            vec![],
            with(conf, "name", json!("n".repeat(200))),
            7,
            "not a valid network name",
        ),
        case(
            "network name empty",
            vec![],
            with(conf, "name", json!("")),
            7,
            "\"name\" is missing",
        ),
        case(
            "bridge name too long",
            vec![],
            with(conf, "bridge", json!("this-is-way-too-long")),
            7,
            "\"bridge\"",
        ),
        case(
            "unknown cniVersion",
            vec![],
            with(conf, "cniVersion", json!("2.0.0")),
            1,
            "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0",
        ),
        case(
            "malformed cniVersion",
            vec![],
            with(conf, "cniVersion", json!("1.0")),
            1,
            "\"1.0\"",
        ),
    ]
}

/// Stdin too large to read, and flatnet-ipam's bad input.
pub(super) fn oversized_and_flatnet_ipam(net: &Network) -> Vec<Case> {
    let conf = &net.conf;
    let mut cases = Vec::new();
    // 10 MB: valid JSON up front, then padding nobody should read to the end.
    let mut huge = br#"{"cniVersion":"1.0.0","name":"x","type":"flatnet","pad":""#.to_vec();
    huge.resize(10 << 20, b'x');
    huge.extend_from_slice(b"\"}");
    cases.push(case(
        "a 10 MB stdin",
        vec![],
        huge,
        7,
        "more than 1048576 bytes",
    ));

    // flatnet-ipam gets its share of the same.
    for (name, stdin, code, needle) in [
        ("empty stdin", Vec::new(), 6u64, "stdin is empty"),
        ("not JSON", b"]]".to_vec(), 6, "cannot decode"),
        (
            "unknown version",
            with(conf, "cniVersion", json!("0.2.0")),
            1,
            "0.2.0",
        ),
        (
            "unknown ipam key",
            with(
                conf,
                "ipam",
                json!({"type": "flatnet-ipam", "subnet": "10.0.0.0/24", "rangestart": "x"}),
            ),
            2,
            "rangestart",
        ),
    ] {
        cases.push(Case {
            name: format!("flatnet-ipam: {name}"),
            plugin: "flatnet-ipam",
            env: vec![],
            stdin,
            code,
            needle: needle.into(),
        });
    }
    cases
}

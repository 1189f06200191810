//! A hostile environment: CNI_COMMAND, CNI_NETNS and CNI_IFNAME bad or
//! missing, bad CNI_ARGS, verbs the config's version does not have, and
//! each verb's required variables missing or empty.

use flatnet_tests::*;
use serde_json::json;

use super::case::{Case, at_1_1_0, case, set, unset, with};

/// CNI_COMMAND, CNI_NETNS and CNI_IFNAME that are wrong.
pub(super) fn variables(net: &Network) -> Vec<Case> {
    let good = net.stdin();
    vec![
        case(
            "CNI_COMMAND missing",
            vec![unset("CNI_COMMAND")],
            good.clone(),
            4,
            "CNI_COMMAND: is missing",
        ),
        case(
            "CNI_COMMAND empty",
            vec![set("CNI_COMMAND", "")],
            good.clone(),
            4,
            "CNI_COMMAND",
        ),
        case(
            "unknown command",
            vec![set("CNI_COMMAND", "FROB")],
            good.clone(),
            4,
            "unknown command \"FROB\"",
        ),
        case(
            "lowercase command",
            vec![set("CNI_COMMAND", "add")],
            good.clone(),
            4,
            "unknown command \"add\"",
        ),
        case(
            "netns does not exist",
            vec![set("CNI_NETNS", "/run/netns/no-such-flatnet-ns")],
            good.clone(),
            4,
            "does not exist",
        ),
        case(
            "netns is a regular file",
            vec![set("CNI_NETNS", "/etc/hostname")],
            good.clone(),
            4,
            "not a namespace",
        ),
        case(
            "netns is a directory",
            vec![set("CNI_NETNS", "/run")],
            good.clone(),
            4,
            "not a namespace",
        ),
        case(
            "netns is a UTS namespace",
            vec![set("CNI_NETNS", "/proc/self/ns/uts")],
            good.clone(),
            4,
            "not a network namespace",
        ),
        case(
            "ifname too long",
            vec![set("CNI_IFNAME", "eth0123456789012")],
            good.clone(),
            4,
            "at most 15",
        ),
        case(
            "ifname with a slash",
            vec![set("CNI_IFNAME", "eth/0")],
            good.clone(),
            4,
            "'/'",
        ),
        case(
            "ifname with a space",
            vec![set("CNI_IFNAME", "eth 0")],
            good.clone(),
            4,
            "' '",
        ),
        case(
            "ifname with a colon",
            vec![set("CNI_IFNAME", "eth0:1")],
            good.clone(),
            4,
            "':'",
        ),
        case(
            "ifname dot-dot",
            vec![set("CNI_IFNAME", "..")],
            good.clone(),
            4,
            "not allowed",
        ),
    ]
}

/// Bad CNI_ARGS, and verbs the version asked for does not have.
pub(super) fn arguments_and_verbs(net: &Network) -> Vec<Case> {
    let good = net.stdin();
    let conf = &net.conf;
    let v1_1 = at_1_1_0(conf);
    vec![
        case(
            "unknown CNI_ARGS key",
            vec![set("CNI_ARGS", "K8S_POD_NAME=web;COLOUR=blue")],
            good.clone(),
            2,
            "COLOUR",
        ),
        case(
            "CNI_ARGS entry without '='",
            vec![set("CNI_ARGS", "IgnoreUnknown=1;junk")],
            good.clone(),
            4,
            "\"junk\"",
        ),
        case(
            "CNI_ARGS bad IP=",
            vec![set("CNI_ARGS", "IP=10.0.0.x")],
            good.clone(),
            4,
            "CNI_ARGS",
        ),
        case(
            "CNI_ARGS bad MAC=",
            vec![set("CNI_ARGS", "MAC=01:02:03:04:05:06")],
            good.clone(),
            4,
            "multicast",
        ),
        case(
            "CHECK on 0.3.1",
            vec![set("CNI_COMMAND", "CHECK")],
            with(conf, "cniVersion", json!("0.3.1")),
            1,
            "CHECK",
        ),
        case(
            "STATUS on 1.0.0",
            vec![set("CNI_COMMAND", "STATUS")],
            good.clone(),
            1,
            "STATUS",
        ),
        case(
            "GC on 1.0.0",
            vec![set("CNI_COMMAND", "GC")],
            with(conf, "cni.dev/valid-attachments", json!([])),
            1,
            "GC",
        ),
        case(
            "GC without valid-attachments",
            vec![set("CNI_COMMAND", "GC")],
            v1_1.to_string().into_bytes(),
            7,
            "cni.dev/valid-attachments",
        ),
        case(
            "GC with malformed valid-attachments",
            vec![set("CNI_COMMAND", "GC")],
            with(
                &v1_1,
                "cni.dev/valid-attachments",
                json!([{"containerID": 5}]),
            ),
            6,
            "GC input",
        ),
    ]
}

/// Each verb without a variable it needs, or with a bad container ID.
pub(super) fn each_verb(net: &Network) -> Vec<Case> {
    let good = net.stdin();
    let v1_1 = at_1_1_0(&net.conf);
    let mut cases = Vec::new();
    for verb in ["ADD", "DEL", "CHECK"] {
        for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"] {
            for (how, change) in [("missing", unset(var)), ("empty", set(var, ""))] {
                cases.push(case(
                    &format!("{verb}: {var} {how}"),
                    vec![set("CNI_COMMAND", verb), change],
                    good.clone(),
                    4,
                    var,
                ));
            }
        }
        for bad_id in [
            "-abc",
            "a b",
            "a/b",
            "a;b",
            "ctr\u{e9}",
            "../../etc",
            ".hidden",
        ] {
            cases.push(case(
                &format!("{verb}: container ID {bad_id:?}"),
                vec![set("CNI_COMMAND", verb), set("CNI_CONTAINERID", bad_id)],
                good.clone(),
                4,
                "CNI_CONTAINERID",
            ));
        }
    }
    for verb in ["ADD", "CHECK"] {
        for (how, change) in [
            ("missing", unset("CNI_NETNS")),
            ("empty", set("CNI_NETNS", "")),
        ] {
            cases.push(case(
                &format!("{verb}: CNI_NETNS {how}"),
                vec![set("CNI_COMMAND", verb), change],
                good.clone(),
                4,
                "CNI_NETNS",
            ));
        }
    }
    for verb in ["STATUS", "GC"] {
        cases.push(case(
            &format!("{verb}: CNI_PATH missing"),
            vec![set("CNI_COMMAND", verb), unset("CNI_PATH")],
            v1_1.to_string().into_bytes(),
            4,
            "CNI_PATH",
        ));
    }
    cases
}

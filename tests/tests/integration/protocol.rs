//! The CNI protocol as a runtime sees it: env + stdin in, JSON out, exit status.

use flatnet_tests::*;
use serde_json::json;

fn flatnet(call: &CniCall, stdin: &[u8]) -> CniOutput {
    call.run(&bin("flatnet"), stdin)
}

#[flatnet_test]
fn version_lists_every_supported_version() {
    let call = CniCall {
        command: "VERSION".into(),
        ..Default::default()
    };
    let out = flatnet(&call, br#"{"cniVersion":"1.0.0"}"#);
    assert!(out.success(), "{out:?}");
    let info = out.json();
    assert_eq!(info["cniVersion"], "1.0.0");
    assert_eq!(
        info["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}

#[flatnet_test]
fn bad_input_gets_an_error_object_on_stdout_and_a_line_on_stderr() {
    let netns = std::path::Path::new("/proc/self/ns/net");
    let good = json!({"cniVersion": "1.0.0", "name": "n", "type": "flatnet", "ipam": {"type": "host-local"}});
    let cases: Vec<(CniCall, Vec<u8>, u64, &str)> = vec![
        (CniCall::new("ADD", "c", netns, "eth0"), b"".to_vec(), 6, "stdin is empty"),
        (CniCall::new("ADD", "c", netns, "eth0"), b"{not json".to_vec(), 6, "cannot decode"),
        (CniCall::new("FROB", "c", netns, "eth0"), good.to_string().into_bytes(), 4, "CNI_COMMAND"),
        (CniCall::new("ADD", "", netns, "eth0"), good.to_string().into_bytes(), 4, "CNI_CONTAINERID"),
        (CniCall::new("ADD", "c", netns, ""), good.to_string().into_bytes(), 4, "CNI_IFNAME"),
        (CniCall::new("ADD", "c", netns, "eth0/x"), good.to_string().into_bytes(), 4, "CNI_IFNAME"),
        (CniCall::new("ADD", "c", std::path::Path::new("/nonexistent"), "eth0"), good.to_string().into_bytes(), 4, "CNI_NETNS"),
        (CniCall::new("ADD", "c", std::path::Path::new("/etc/hostname"), "eth0"), good.to_string().into_bytes(), 4, "CNI_NETNS"),
        (CniCall::new("ADD", "c", netns, "eth0"), json!({"cniVersion": "9.0.0", "name": "n"}).to_string().into_bytes(), 1, "9.0.0"),
        (
            CniCall::new("ADD", "c", netns, "eth0"),
            json!({"cniVersion": "1.0.0", "name": "n", "type": "flatnet", "ipam": {"type": "no-such-ipam"}}).to_string().into_bytes(),
            7,
            "no-such-ipam",
        ),
    ];
    for (call, stdin, code, needle) in cases {
        flatnet(&call, &stdin).assert_error(code, needle);
    }
}

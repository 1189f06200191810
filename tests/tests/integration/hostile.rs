//! Hostile input, table-driven: each case gets the right CNI error code, a
//! message that names the problem, a clean exit (status 1: no panic, no
//! signal), and leaves the node exactly as it was.
//!
//! "The node" is a private one, so the before/after comparison can be exact
//! even while other tests or people use the machine: a network namespace
//! plus a private mount namespace with its own bpffs (held by a sleeping
//! process), running a live pod of the network under attack. Every call is
//! made inside it with nsenter; the snapshot covers its links, addresses,
//! routes, neighbours, qdiscs and tc filters, every pinned file under its
//! /sys/fs/bpf, the endpoint and host-veth maps (bpftool), and the IPAM data
//! dir.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flatnet_tests::*;
use serde_json::{Value, json};

/// A node of its own: netns + mount namespace with a private bpffs.
struct PrivateNode {
    /// The node's network namespace (deleted on drop, after the holder).
    _netns: Netns,
    holder: Child,
}

impl PrivateNode {
    fn new() -> Self {
        let netns = Netns::new();
        // `ip netns exec` gives the command a mount namespace of its own
        // (slave to the host's, /sys remounted for the netns); the bpffs
        // mounted there is this node's only.
        let holder = Command::new("ip")
            .args(["netns", "exec", &netns.name, "sh", "-c"])
            .arg("mount -t bpf bpf /sys/fs/bpf && exec sleep 3600")
            .stdin(Stdio::null())
            .spawn()
            .expect("start the node's holder process");
        let node = PrivateNode {
            _netns: netns,
            holder,
        };
        wait_until("the private bpffs", Duration::from_secs(10), || {
            node.sh("stat -f -c %T /sys/fs/bpf").trim() == "bpf_fs"
        });
        node
    }

    /// A command run inside the node (its netns and mount namespace).
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &self.holder.id().to_string(),
            "--mount",
            "--net",
            "--",
        ])
        .arg(program);
        cmd
    }

    fn sh(&self, script: &str) -> String {
        let out = self
            .command(Path::new("/bin/sh"))
            .args(["-c", script])
            .output()
            .expect("nsenter");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// A snapshot once the kernel is done with a new pod's veth (IPv6
/// link-local address, duplicate address detection): two in a row, 1 s
/// apart, alike.
fn settled_snapshot(node: &PrivateNode, net: &Network) -> String {
    let mut last: Option<String> = None;
    let settled = poll_until(Duration::from_secs(15), Duration::from_secs(1), || {
        let now = snapshot(node, net);
        // DAD keeps a new link-local address "tentative" for a second or two.
        let alike = last.as_ref() == Some(&now) && !now.contains("tentative");
        last = Some(now);
        alike
    });
    assert!(
        settled,
        "the node never settled: the snapshot before the calls would be a moving target"
    );
    last.expect("a snapshot")
}

/// Everything of the node a plugin call could change.
fn snapshot(node: &PrivateNode, net: &Network) -> String {
    let pins = format!("/sys/fs/bpf/flatnet/{}", net.name.replace('.', "~"));
    let script = format!(
        r#"
echo '## links'; ip -o link
echo '## addresses'; ip -o addr
echo '## routes'; ip route show table all; ip -6 route show table all
echo '## neighbours'; ip neigh show nud permanent
echo '## qdiscs'; tc qdisc show
echo '## filters'; for dev in $(ls /sys/class/net); do tc filter show dev $dev ingress; tc filter show dev $dev egress; done
echo '## tcx and xdp programs'; bpftool net show
echo '## xdp'; ip -o link show | grep -o 'prog/xdp id [0-9]*'
echo '## nftables'; nft list ruleset 2>&1
echo '## pins'; find /sys/fs/bpf | sort
echo '## endpoints'; bpftool -j map dump pinned {pins}/ENDPOINTS_V4 2>&1
echo '## endpoints v6'; bpftool -j map dump pinned {pins}/ENDPOINTS_V6 2>&1
echo '## host veths'; bpftool -j map dump pinned {pins}/HOST_VETHS 2>&1
"#
    );
    let mut text = node.sh(&script);
    text.push_str("## ipam data dir\n");
    text.push_str(&dir_listing(&net.ipam_dir));
    text
}

fn dir_listing(dir: &Path) -> String {
    let mut lines = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path.clone());
                lines.push(format!("{}/", path.display()));
            } else {
                let content = std::fs::read(&path).unwrap_or_default();
                lines.push(format!(
                    "{} {}",
                    path.display(),
                    String::from_utf8_lossy(&content)
                ));
            }
        }
    }
    lines.sort();
    lines.join("\n")
}

/// One hostile invocation.
struct Case {
    name: String,
    plugin: &'static str,
    /// Variables to change from the valid ADD environment: None unsets.
    env: Vec<(&'static str, Option<String>)>,
    stdin: Vec<u8>,
    code: u64,
    needle: String,
}

fn case(
    name: &str,
    env: Vec<(&'static str, Option<String>)>,
    stdin: Vec<u8>,
    code: u64,
    needle: &str,
) -> Case {
    Case {
        name: name.into(),
        plugin: "flatnet",
        env,
        stdin,
        code,
        needle: needle.into(),
    }
}

fn set(var: &'static str, value: &str) -> (&'static str, Option<String>) {
    (var, Some(value.to_string()))
}

fn unset(var: &'static str) -> (&'static str, Option<String>) {
    (var, None)
}

fn with(conf: &Value, key: &str, value: Value) -> Vec<u8> {
    let mut conf = conf.clone();
    conf[key] = value;
    conf.to_string().into_bytes()
}

fn cases(net: &Network) -> Vec<Case> {
    let good = net.stdin();
    let conf = &net.conf;
    let mut v1_1 = conf.clone();
    v1_1["cniVersion"] = json!("1.1.0");
    let mut cases = vec![
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
    ];
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

fn base_env(target_netns: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", "ADD".into()),
        ("CNI_CONTAINERID", "hostile-ctr".into()),
        ("CNI_NETNS", target_netns.display().to_string()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_PATH", cni_path()),
    ]
}

fn invoke(
    node: &PrivateNode,
    plugin: &Path,
    env: &[(&'static str, Option<String>)],
    stdin: &[u8],
) -> CniOutput {
    let mut cmd = node.command(plugin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (key, value) in env {
        if let Some(value) = value {
            cmd.env(key, value);
        }
    }
    run_with_stdin(&mut cmd, stdin)
}

fn env_for(
    base: &[(&'static str, String)],
    changes: &[(&'static str, Option<String>)],
) -> Vec<(&'static str, Option<String>)> {
    let mut env: Vec<(&'static str, Option<String>)> =
        base.iter().map(|(k, v)| (*k, Some(v.clone()))).collect();
    for (key, value) in changes {
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.clone(),
            None => env.push((key, value.clone())),
        }
    }
    env
}

fn first_difference(before: &str, after: &str) -> String {
    let (b, a): (Vec<_>, Vec<_>) = (before.lines().collect(), after.lines().collect());
    for line in &a {
        if !b.contains(line) {
            return format!("appeared: {line}");
        }
    }
    for line in &b {
        if !a.contains(line) {
            return format!("vanished: {line}");
        }
    }
    "line order changed".into()
}

#[flatnet_test(root)]
fn hostile_input_is_refused_precisely_and_changes_nothing() {
    let node = PrivateNode::new();
    let net = Network::flatnet_ipam();
    // A live pod on the node, so there is state to disturb.
    let pod_ns = Netns::new();
    let target_ns = Netns::new();
    let flatnet = bin("flatnet");
    let mut pod_env = env_for(&base_env(&pod_ns.path()), &[]);
    pod_env[1].1 = Some("hostile-pod".into());
    let out = invoke(&node, &flatnet, &pod_env, &net.stdin());
    assert!(out.success(), "the node's pod: {out:?}");
    let before = settled_snapshot(&node, &net);
    assert!(
        before.contains("\"key\""),
        "the endpoint map is readable: {before}"
    );
    assert!(net.ipam_allocations().len() == 1);

    let base = base_env(&target_ns.path());
    let mut failures = Vec::new();
    let all = cases(&net);
    let count = all.len();
    for case in all {
        let env = env_for(&base, &case.env);
        let out = invoke(&node, &bin(case.plugin), &env, &case.stdin);
        let problem = check_outcome(&case, &out);
        let after = snapshot(&node, &net);
        let problem = problem.or_else(|| {
            (after != before)
                .then(|| format!("the node changed: {}", first_difference(&before, &after)))
        });
        if let Some(problem) = problem {
            eprintln!("FAILED {}: {problem}\n  {out:?}", case.name);
            failures.push(format!("{}: {problem}", case.name));
        } else {
            let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
            eprintln!("ok {:<45} code {} {msg}", case.name, case.code);
        }
    }

    // The pod is still served, then leaves cleanly.
    pod_env[0].1 = Some("DEL".into());
    let out = invoke(&node, &flatnet, &pod_env, &net.stdin());
    assert!(out.success(), "DEL of the node's pod: {out:?}");
    assert!(net.ipam_allocations().is_empty());
    assert!(
        failures.is_empty(),
        "{} of {count} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Why `out` is not the answer `case` needs, if it is not.
fn check_outcome(case: &Case, out: &CniOutput) -> Option<String> {
    if out.code != Some(1) {
        return Some(format!(
            "exit status {:?}, not 1 (a panic is 101, a signal None)",
            out.code
        ));
    }
    if out.stderr.contains("panicked") {
        return Some("panicked".into());
    }
    let Ok(object) = serde_json::from_str::<Value>(out.stdout.trim()) else {
        return Some(format!(
            "stdout is not one JSON error object: {:?}",
            out.stdout
        ));
    };
    if object["code"] != case.code {
        return Some(format!("code {} instead of {}", object["code"], case.code));
    }
    let msg = object["msg"].as_str().unwrap_or_default();
    if !msg.contains(&case.needle) {
        return Some(format!("message {msg:?} does not name {:?}", case.needle));
    }
    if object["cniVersion"].as_str().is_none_or(str::is_empty) {
        return Some("the error object has no cniVersion".into());
    }
    if out.stderr.trim().is_empty() {
        return Some("no human line on stderr".into());
    }
    None
}

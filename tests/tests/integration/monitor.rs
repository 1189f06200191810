//! Operators see NetworkPolicy: `flatnet monitor` streams the packets policy
//! drops (read from the datapath's `POLICY_EVENTS` ring buffer), `flatnet
//! inspect` shows each pod's isolation, rules and drops, and the agent's
//! metrics count the drops per pod and direction. The policy is written
//! through the Datapath API, as the agent writes it.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use flatnet_agent::metrics::{AgentMetrics, registry, render};
use flatnet_datapath::bpf::{PolicyPortRange, PolicyPorts, PolicyRule};
use flatnet_datapath::node::markers::policy_names_file;
use flatnet_tests::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Kills the monitor if the test fails before it stops it.
struct Monitor(Child);

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines a reader of `stream` sees, through a channel.
fn lines(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[flatnet_test(root)]
fn monitor_streams_a_denied_syn_and_inspect_shows_the_policy() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    let datapath = net.datapath();
    let slot = datapath
        .slot_of(a.ip().into())
        .unwrap()
        .expect("A's counter slot");
    // A may reach B on TCP 8080 only.
    let egress = [PolicyRule {
        cidr: format!("{}/32", b.ip()).parse().unwrap(),
        ports: PolicyPorts::Ranges(vec![PolicyPortRange {
            protocol: 6,
            first: 8080,
            last: 8080,
        }]),
    }];
    datapath.set_pod_policy(slot, None, Some(&egress)).unwrap();
    // What the agent would record for A.
    let names_file = policy_names_file(&net.name);
    std::fs::write(
        &names_file,
        serde_json::json!({ a.ip().to_string(): ["default/only-web"] }).to_string(),
    )
    .unwrap();
    struct RemoveFile(std::path::PathBuf);
    impl Drop for RemoveFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _names = RemoveFile(names_file);

    let mut child = Command::new(bin("flatnet"))
        .args(["monitor", "--json", "--network", &net.name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines(child.stdout.take().unwrap());
    let stderr = lines(child.stderr.take().unwrap());
    let mut monitor = Monitor(child);
    let banner = stderr
        .recv_timeout(Duration::from_secs(10))
        .expect("the monitor's banner");
    assert!(banner.contains("monitoring"), "{banner}");

    // A SYN to B's port 9090: dropped by A's egress (and retransmitted
    // until the connect times out: each one an event).
    let target = SocketAddr::from((b.ip(), 9090));
    let connected = in_ns(Some(&a.netns), || {
        TcpStream::connect_timeout(&target, Duration::from_millis(500))
    });
    assert!(connected.is_err(), "A reached B on 9090 through its policy");
    let line = stdout
        .recv_timeout(Duration::from_secs(10))
        .expect("a line for the dropped SYN");
    let drop: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(drop["network"], net.name.as_str(), "{line}");
    assert_eq!(drop["slot"], slot, "{line}");
    assert_eq!(drop["direction"], "egress", "{line}");
    assert_eq!(drop["peer"], b.ip().to_string(), "{line}");
    assert_eq!(drop["src"], a.ip().to_string(), "{line}");
    assert_eq!(drop["protocol"], "tcp", "{line}");
    assert_eq!(drop["dst_port"], 9090, "{line}");
    assert!(drop["src_port"].as_u64().unwrap() > 0, "{line}");
    assert_eq!(drop["reason"], "port-not-allowed", "{line}");
    assert_eq!(drop["pod"]["addresses"][0], a.ip().to_string(), "{line}");
    assert_eq!(drop["pod"]["host_veth"], a.host_veth().as_str(), "{line}");
    assert!(drop["time"].as_str().unwrap().ends_with('Z'), "{line}");

    // SIGINT: a clean exit.
    kill(Pid::from_raw(monitor.0.id() as i32), Signal::SIGINT).unwrap();
    let mut status = None;
    wait_until("the monitor to exit", Duration::from_secs(5), || {
        status = monitor.0.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "monitor: {status:?}");

    // inspect: A's isolation, rule count, drops and policy names.
    let out =
        run_ok(Command::new(bin("flatnet")).args(["inspect", "--json", "--network", &net.name]));
    let reports: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pods = reports[0]["pods"].as_array().unwrap();
    let pod_a = pods
        .iter()
        .find(|p| p["addresses"][0] == a.ip().to_string())
        .expect("A in inspect");
    let policy = &pod_a["policy"];
    assert_eq!(policy["egress_isolated"], true, "{policy}");
    assert_eq!(policy["ingress_isolated"], false, "{policy}");
    assert_eq!(policy["egress_rules"], 1, "{policy}");
    assert_eq!(policy["ingress_rules"], 0, "{policy}");
    let dropped = policy["egress_drops"]["packets"].as_u64().unwrap();
    assert!(dropped >= 1, "{policy}");
    assert_eq!(policy["policies"][0], "default/only-web", "{policy}");
    let text = run_ok(Command::new(bin("flatnet")).args(["inspect", "--network", &net.name]));
    let row = text
        .lines()
        .skip_while(|l| !l.contains("POLICY OF POD"))
        .find(|l| l.trim_start().starts_with(&format!("{} ", a.ip())))
        .unwrap_or_else(|| panic!("no policy row for A in\n{text}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        fields[1..7],
        ["open", "isolated", "0", "1", "0", &dropped.to_string()],
        "{text}"
    );
    assert!(row.ends_with("default/only-web"), "{text}");

    // The agent's metric, as a scrape renders it.
    let metrics = render(&registry(&datapath, &AgentMetrics::default())).unwrap();
    let veth_index = pod_a["host_ifindex"].as_u64().unwrap();
    let series = format!(
        "flatnet_policy_denied_packets_total{{host_veth_ifindex=\"{veth_index}\",direction=\"egress\"}} {dropped}"
    );
    assert!(metrics.contains(&series), "{series} not in\n{metrics}");
}

#[flatnet_test(root)]
fn monitor_names_a_network_without_a_datapath() {
    let name = unique("ft-nodp-");
    let out = Command::new(bin("flatnet"))
        .args(["monitor", "--network", &name])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("network {name} has no datapath")),
        "{stderr}"
    );
}

//! Leak-proof addresses under a real runtime: a simulated node (its own
//! network namespace on the cluster harness's underlay) runs the real
//! flatnet-agent with `--cri-socket` and a real containerd 1.6 (CRI plugin)
//! in the same namespace, on the conflist the agent wrote. containerd never
//! runs CNI GC; the agent's reclaim loop must give back what a DEL that
//! never came left behind, and never touch a live sandbox's address.
//!
//! - An attachment no runtime knows (a plain ADD, as `ctr run --cni` makes,
//!   whose netns then vanished): still held at half the grace period,
//!   released within a few resyncs after it, datapath entry gone.
//! - containerd SIGKILLed in the middle of an ADD (the plugin stopped at
//!   its last stage with FLATNET_STOP_AFTER, then killed too): containerd
//!   still lists the half-made sandbox after its restart, so the loop keeps
//!   it and the runtime's Stop+Remove releases it; when the runtime loses its
//!   record of such a sandbox, the loop releases address, host veth and
//!   datapath entry after the grace period.
//! - 32 live sandboxes, sandboxes started and removed around them, 500
//!   reclaim passes: nothing reclaimed, every live address still held, the
//!   pods still talk.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::cluster::{Cluster, SimNode};
use flatnet_tests::containerd::{Containerd, TOOLS, TestImages};
use flatnet_tests::cri::{CriClient, PodSpec};
use flatnet_tests::kube_stub::metric;
use flatnet_tests::*;

/// containerd, runc, busybox and the loopback plugin.
fn reclaim_tools() -> Vec<(String, &'static str)> {
    TOOLS
        .iter()
        .map(|(tool, package)| (tool.to_string(), *package))
        .chain(reference_plugins(&["loopback"]))
        .collect()
}

/// The agent's grace period and resync interval in these tests. The grace
/// must outlast a RunPodSandbox from its CNI ADD to the sandbox being
/// listed, as the agent's default (60 s) does by far: under CI's load a
/// 2 s grace once reclaimed a live sandbox still being started.
const GRACE_SECS: f64 = 4.0;
const RESYNC_SECS: f64 = 0.05;

/// One node with its agent (reclaim on) and containerd. containerd goes
/// first on drop: its sandboxes get their DELs while the node still exists.
struct CriNode {
    containerd: Containerd,
    cluster: Cluster,
}

impl CriNode {
    fn start(grace_secs: f64) -> Self {
        TestImages::set_cache_dir(Path::new(env!("CARGO_TARGET_TMPDIR")));
        let specs = Cluster::numbered(1, false);
        let mut cluster = Cluster::new(&specs);
        let socket_link = cluster.nodes[0].dir.join("cri.sock");
        cluster.nodes[0].agent_flags = vec![
            "--cri-socket".into(),
            socket_link.display().to_string(),
            "--reclaim-grace-secs".into(),
            grace_secs.to_string(),
            "--resync-secs".into(),
            RESYNC_SECS.to_string(),
        ];
        cluster.write_peers(&specs);
        let node = &cluster.nodes[0];
        node.start_agent(&cluster.file());
        // The conflist and the plugins containerd's CRI runs (loopback for
        // every sandbox, portmap and bandwidth) are the agent's to install.
        node.wait_ready();
        assert!(
            node.bin_dir().join("loopback").exists(),
            "the agent installs the loopback plugin containerd's CRI runs"
        );
        let containerd = Containerd::start_in(
            Some(&node.netns.path()),
            &node.dir.join("conf"),
            &node.bin_dir(),
        )
        .unwrap_or_else(|e| panic!("containerd: {e:#}"));
        // Until now the agent's passes found no runtime and released nothing.
        std::os::unix::fs::symlink(containerd.socket(), &socket_link).expect("socket link");
        CriNode {
            containerd,
            cluster,
        }
    }

    fn node(&self) -> &SimNode {
        &self.cluster.nodes[0]
    }

    fn client(&self) -> CriClient {
        self.containerd
            .client()
            .unwrap_or_else(|e| panic!("CRI client: {e:#}"))
    }

    /// The addresses flatnet-ipam holds for the node's network.
    fn allocations(&self) -> Vec<IpAddr> {
        let dir = self.node().dir.join("ipam").join(&self.node().network);
        let mut held: Vec<IpAddr> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        held.sort();
        held
    }

    fn has_endpoint(&self, ip: IpAddr) -> bool {
        self.node()
            .datapath()
            .all_endpoints()
            .expect("ENDPOINTS")
            .iter()
            .any(|(address, _)| *address == ip)
    }

    /// A counter or gauge of the agent's metrics page (0 when absent).
    /// `flatnet_ipam_reclaimed_total` reaches `count` and stays there: it
    /// is counted when the agent's pass ends, a moment after its DEL
    /// released the address and the endpoint (CI read 0 in between).
    fn assert_reclaimed(&self, count: u64) {
        wait_until("the reclaim to be counted", Duration::from_secs(5), || {
            self.metric("flatnet_ipam_reclaimed_total") >= count
        });
        assert_eq!(
            self.metric("flatnet_ipam_reclaimed_total"),
            count,
            "{}",
            self.node().agent_log()
        );
    }

    fn metric(&self, name: &str) -> u64 {
        metric(&self.node().metrics(), name).map_or(0, |v| v as u64)
    }

    fn passes(&self) -> u64 {
        self.metric("flatnet_ipam_reclaim_passes_total")
    }

    /// Asked of the kernel by name in the node's netns (/sys/class/net
    /// shows the test's own namespace whatever thread looks).
    fn link_in_node(&self, name: &str) -> bool {
        std::process::Command::new("ip")
            .args(["-n", &self.node().netns.name, "link", "show", "dev", name])
            .output()
            .expect("ip link show")
            .status
            .success()
    }

    /// Waits until the agent has made `more` passes from now.
    fn wait_passes(&self, more: u64) {
        let target = self.passes() + more;
        wait_until(
            &format!("{more} more reclaim passes"),
            Duration::from_secs(60),
            || self.passes() >= target,
        );
    }

    /// Waits for `ip` to be released; how long it took from `since`.
    fn wait_released(&self, ip: IpAddr, since: Instant) -> Duration {
        let released = poll_until(
            Duration::from_secs_f64(GRACE_SECS * 10.0),
            Duration::from_millis(20),
            || !self.allocations().contains(&ip),
        );
        assert!(
            released,
            "{ip} was never reclaimed; allocations {:?}\nagent log:\n{}",
            self.allocations(),
            self.node().agent_log()
        );
        since.elapsed()
    }
}

/// The sandbox's IPv4 address (PodSandboxStatus) and its netns path.
fn sandbox_address(client: &CriClient, id: &str) -> (Ipv4Addr, PathBuf) {
    let status = client.pod_sandbox_status(id).expect("PodSandboxStatus");
    (
        status.ip.parse().expect("an IPv4 sandbox address"),
        status.netns.expect("the sandbox's netns"),
    )
}

/// A TCP exchange from the netns at `from` to a listener in the netns at
/// `to` on `address`: the listener answers with what it read, reversed.
fn talk(from: &Path, to: &Path, address: Ipv4Addr) {
    let (to, from) = (to.to_path_buf(), from.to_path_buf());
    let listener = std::thread::spawn(move || {
        enter_thread(&to).expect("enter the server's netns");
        let listener = TcpListener::bind((address, 7070)).expect("listen");
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 32];
        let n = conn.read(&mut buf).expect("read");
        buf[..n].reverse();
        conn.write_all(&buf[..n]).expect("write");
    });
    let answer = std::thread::spawn(move || {
        enter_thread(&from).expect("enter the client's netns");
        let mut conn = None;
        poll_until(Duration::from_secs(5), Duration::from_millis(20), || {
            conn = TcpStream::connect((address, 7070)).ok();
            conn.is_some()
        });
        let mut conn = conn.expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"reclaim").expect("send");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).expect("answer");
        answer
    })
    .join()
    .expect("client");
    listener.join().expect("server");
    assert_eq!(answer, "mialcer");
}

/// A plain ADD of a container no runtime knows (as `ctr run --cni` makes),
/// its netns then deleted: the DEL never comes. The address is still held
/// at half the grace period and gone a few resyncs after it, with the
/// datapath entry; the live sandboxes keep theirs.
#[flatnet_test(root, tools = reclaim_tools())]
fn an_attachment_whose_del_never_comes_is_reclaimed_after_the_grace_period() {
    let cri = CriNode::start(GRACE_SECS);
    let client = cri.client();
    let live: Vec<String> = (0..2)
        .map(|i| {
            let started = Instant::now();
            let id = client
                .run_pod_sandbox(&PodSpec::new(&format!("live{i}")))
                .expect("RunPodSandbox");
            eprintln!("RunPodSandbox live{i}: {:?}", started.elapsed());
            id
        })
        .collect();
    let live_ips: Vec<Ipv4Addr> = live
        .iter()
        .map(|id| sandbox_address(&client, id).0)
        .collect();

    let lost_netns = Netns::new();
    let lost_id = unique("lost-");
    // No sandbox ever owns this attachment, so the agent's grace period
    // runs from the first pass that sees it, right after this ADD (not from
    // the netns going: measured from there, a reclaim after 1.8 s of a 2 s
    // grace looked early).
    let added = Instant::now();
    let out = cri.node().cni("ADD", Some((&lost_id, &lost_netns.path())));
    assert!(out.success(), "ADD: {out:?}");
    let lost_ip = result_ips(&out.json())[0];
    let lost_veth = AttachmentNames::new(&cri.node().network, &lost_id, "eth0").host_veth;
    assert!(cri.has_endpoint(lost_ip));
    // The netns goes, and the veth pair with it, behind everyone's back.
    drop(lost_netns);
    wait_until("the lost pod's veth to go", Duration::from_secs(5), || {
        !cri.link_in_node(&lost_veth)
    });

    let halfway = added + Duration::from_secs_f64(GRACE_SECS / 2.0);
    std::thread::sleep(halfway.saturating_duration_since(Instant::now()));
    let held = cri.allocations().contains(&lost_ip);
    if added.elapsed() < Duration::from_secs_f64(GRACE_SECS) {
        assert!(held, "{lost_ip} released inside the grace period");
    }
    let took = cri.wait_released(lost_ip, added);
    eprintln!("reclaimed after {took:?} (grace {GRACE_SECS} s, resync {RESYNC_SECS} s)");
    assert!(took >= Duration::from_secs_f64(GRACE_SECS), "{took:?}");
    wait_until(
        "the lost pod's endpoint to go",
        Duration::from_secs(5),
        || !cri.has_endpoint(lost_ip),
    );
    cri.assert_reclaimed(1);
    let held = cri.allocations();
    for ip in &live_ips {
        assert!(held.contains(&IpAddr::V4(*ip)), "live {ip} lost: {held:?}");
    }
    let (a, b) = (
        sandbox_address(&client, &live[0]),
        sandbox_address(&client, &live[1]),
    );
    talk(&a.1, &b.1, b.0);
    let in_use = format!(
        "flatnet_ipam_allocations{{range=\"{}\"}}",
        cri.node().spec.pod_cidr.as_deref().unwrap_or_default()
    );
    wait_until(
        "the allocations gauge to say 2",
        Duration::from_secs(5),
        || cri.metric(&in_use) == 2,
    );
}

/// What a RunPodSandbox whose runtime was SIGKILLed at the plugin's last
/// stage left: (sandbox id, its address). The plugin is stopped there
/// (FLATNET_STOP_AFTER), containerd killed, then the plugin killed too;
/// containerd is started again without the crash point.
fn kill_the_runtime_mid_add(cri: &mut CriNode) -> (String, IpAddr) {
    cri.containerd
        .set_env(&[("FLATNET_STOP_AFTER", "pod inserted")]);
    cri.containerd.kill_only();
    cri.containerd
        .restart()
        .expect("containerd with the crash point");
    let client = cri.client();
    let before = cri.allocations();
    let runner = std::thread::spawn(move || client.run_pod_sandbox(&PodSpec::new("doomed")));
    let mut plugin = None;
    wait_until(
        "the plugin to stop at its crash point",
        Duration::from_secs(20),
        || {
            plugin = stopped_plugin();
            plugin.is_some()
        },
    );
    let (pid, netns, container_id) = plugin.expect("the stopped plugin");
    cri.containerd.note_netns(&netns);
    cri.containerd.kill_only();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(
        runner.join().expect("runner").is_err(),
        "RunPodSandbox succeeded"
    );
    cri.containerd.set_env(&[]);
    cri.containerd.restart().expect("containerd again");
    let leaked: Vec<IpAddr> = cri
        .allocations()
        .into_iter()
        .filter(|ip| !before.contains(ip))
        .collect();
    assert_eq!(leaked.len(), 1, "the killed ADD's address: {leaked:?}");
    let veth = AttachmentNames::new(&cri.node().network, &container_id, "eth0").host_veth;
    assert!(cri.link_in_node(&veth), "the killed ADD made no veth");
    assert!(cri.has_endpoint(leaked[0]));
    (container_id, leaked[0])
}

/// containerd SIGKILLed in the middle of a sandbox's ADD. containerd 1.6
/// records a sandbox before its network is set up, so after the restart it
/// lists the half-made one (NOTREADY): the reclaim loop must leave it alone
/// however long it waits (the runtime owns it), and the runtime's own
/// Stop+Remove, as kubelet issues for a NOTREADY sandbox, releases all of
/// it. If the runtime then loses its record of such a sandbox (its
/// metadata removed behind its back, and restarted), the reclaim loop takes
/// the address, veth and datapath entry back after the grace period.
#[flatnet_test(root, tools = reclaim_tools())]
fn the_runtime_killed_mid_add_leaks_nothing() {
    let mut cri = CriNode::start(GRACE_SECS);
    let (sandbox, address) = kill_the_runtime_mid_add(&mut cri);
    let client = cri.client();
    let listed = client.list_pod_sandbox().expect("ListPodSandbox");
    assert!(
        listed.iter().any(|(id, _)| *id == sandbox),
        "containerd forgot the half-made sandbox: {listed:?}"
    );
    // Twice the grace period of passes: still the runtime's.
    std::thread::sleep(Duration::from_secs_f64(GRACE_SECS * 2.0));
    cri.wait_passes(2);
    assert!(
        cri.allocations().contains(&address),
        "reclaimed a listed sandbox's address"
    );
    assert_eq!(cri.metric("flatnet_ipam_reclaimed_total"), 0);
    client.stop_pod_sandbox(&sandbox).expect("StopPodSandbox");
    client
        .remove_pod_sandbox(&sandbox)
        .expect("RemovePodSandbox");
    let veth = AttachmentNames::new(&cri.node().network, &sandbox, "eth0").host_veth;
    assert!(
        !cri.allocations().contains(&address),
        "Stop+Remove left the address"
    );
    assert!(!cri.link_in_node(&veth) && !cri.has_endpoint(address));

    // Again, and this time the runtime loses its record of the sandbox.
    let (sandbox, address) = kill_the_runtime_mid_add(&mut cri);
    // The agent's clock for an unlisted attachment may have started while
    // the ADD was in flight (containerd lists a sandbox only once its
    // network is up); a pass that sees the restarted runtime list it stops
    // that clock. Two passes: the first may have asked the runtime before
    // the restart.
    cri.wait_passes(2);
    // The runtime can stop listing the sandbox from the removal on (a pass
    // during the restart may already miss it), so the grace period is
    // measured from before the removal.
    let forgotten = Instant::now();
    let removed = std::process::Command::new("ctr")
        .arg("--address")
        .arg(cri.containerd.socket())
        .args(["-n", "k8s.io", "containers", "rm", &sandbox])
        .output()
        .expect("ctr containers rm");
    assert!(removed.status.success(), "ctr containers rm: {removed:?}");
    cri.containerd.kill_only();
    cri.containerd
        .restart()
        .expect("containerd, sandbox forgotten");
    let client = cri.client();
    let listed = client.list_pod_sandbox().expect("ListPodSandbox");
    assert!(listed.iter().all(|(id, _)| *id != sandbox), "{listed:?}");
    let took = cri.wait_released(address, forgotten);
    eprintln!("reclaimed {address} {took:?} after the runtime forgot it");
    assert!(took >= Duration::from_secs_f64(GRACE_SECS), "{took:?}");
    let veth = AttachmentNames::new(&cri.node().network, &sandbox, "eth0").host_veth;
    wait_until(
        "the veth and endpoint to go",
        Duration::from_secs(5),
        || !cri.link_in_node(&veth) && !cri.has_endpoint(address),
    );
    cri.assert_reclaimed(1);
    // The node still works: a new sandbox gets an address.
    let id = client
        .run_pod_sandbox(&PodSpec::new("after"))
        .expect("RunPodSandbox");
    let (ip, _) = sandbox_address(&client, &id);
    assert!(cri.allocations().contains(&IpAddr::V4(ip)));
}

/// The flatnet plugin stopped at FLATNET_STOP_AFTER: (pid, CNI_NETNS,
/// CNI_CONTAINERID), once it is in state T.
fn stopped_plugin() -> Option<(u32, PathBuf, String)> {
    for entry in std::fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: BTreeMap<String, String> = environ
            .split(|b| *b == 0)
            .filter_map(|var| {
                let text = String::from_utf8_lossy(var);
                let (k, v) = text.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect();
        if !vars.contains_key("FLATNET_STOP_AFTER")
            || vars.get("CNI_COMMAND").map(String::as_str) != Some("ADD")
        {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('T') {
            return Some((
                pid,
                PathBuf::from(vars.get("CNI_NETNS")?),
                vars.get("CNI_CONTAINERID")?.clone(),
            ));
        }
    }
    None
}

/// 32 sandboxes live through 500 reclaim passes while others are started
/// and removed around them: nothing is reclaimed, every live sandbox keeps
/// its address, veth and endpoint, and pods still talk at the end.
#[flatnet_test(root, tools = reclaim_tools())]
fn live_sandboxes_keep_their_addresses_through_churn_and_500_passes() {
    // A grace period well above a RunPodSandbox on a loaded machine.
    let cri = CriNode::start(5.0);
    let client = cri.client();
    // Passes before containerd was up found no runtime (and released nothing).
    let failures_before = cri.metric("flatnet_ipam_reclaim_failures_total");
    let pods: Vec<PodSpec> = (0..32).map(|i| PodSpec::new(&format!("live{i}"))).collect();
    let live: Vec<String> = client
        .run_pod_sandboxes(&pods)
        .into_iter()
        .map(|r| r.expect("RunPodSandbox"))
        .collect();
    let addresses: Vec<(Ipv4Addr, PathBuf)> =
        live.iter().map(|id| sandbox_address(&client, id)).collect();

    let target = cri.passes() + 500;
    let mut churned = 0;
    while cri.passes() < target {
        let batch: Vec<PodSpec> = (0..4)
            .map(|i| PodSpec::new(&format!("churn{churned}-{i}")))
            .collect();
        let ids: Vec<String> = client
            .run_pod_sandboxes(&batch)
            .into_iter()
            .map(|r| r.expect("RunPodSandbox"))
            .collect();
        for result in client.stop_and_remove_pod_sandboxes(&ids) {
            result.expect("Stop+Remove");
        }
        churned += ids.len();
    }
    eprintln!("{churned} sandboxes churned during 500 passes");
    cri.wait_passes(2);
    assert_eq!(
        cri.metric("flatnet_ipam_reclaimed_total"),
        0,
        "{}",
        cri.node().agent_log()
    );
    assert_eq!(
        cri.metric("flatnet_ipam_reclaim_failures_total"),
        failures_before
    );
    let held = cri.allocations();
    assert_eq!(held.len(), 32, "{held:?}");
    for (id, (ip, _)) in live.iter().zip(&addresses) {
        assert!(held.contains(&IpAddr::V4(*ip)), "{ip} of {id} released");
        assert!(cri.has_endpoint(IpAddr::V4(*ip)), "{ip}'s endpoint gone");
        let veth = AttachmentNames::new(&cri.node().network, id, "eth0").host_veth;
        assert!(cri.link_in_node(&veth), "{veth} gone");
    }
    for pair in addresses.chunks(2).step_by(4) {
        talk(&pair[0].1, &pair[1].1, pair[1].0);
    }
}

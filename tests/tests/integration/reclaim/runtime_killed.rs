//! A runtime SIGKILLed in the middle of an ADD leaks nothing: the
//! half-made sandbox it still lists is kept until its Stop and Remove, and
//! one it lost is reclaimed after the grace period.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::cri::PodSpec;
use flatnet_tests::*;

use super::fixture::{CriNode, GRACE_SECS, reclaim_tools, sandbox_address};

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

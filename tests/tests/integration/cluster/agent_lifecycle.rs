//! The agent's setup through its life: uninstall takes it away while pods
//! keep talking, restarts keep established streams and programs, a plugin
//! of another build never replaces the agent's datapath, and a moved pin
//! root cannot split it.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flatnet_common::{PROG_FROM_POD, PROG_FROM_UPLINK, action};
use flatnet_tests::cluster::*;
use flatnet_tests::*;
use serde_json::json;

use super::fixture::{no_masq_elements, uplink_program_attached};

/// The periodic re-check lists the no-masquerade sets only when nftables
/// changed since it found them right (its generation moved): a set
/// flushed by hand is a change, and is filled again.
#[flatnet_test(root)]
fn a_no_masquerade_set_emptied_by_hand_is_filled_again() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--ip-masq", "true"]);
    let n1 = cluster.node("n1");
    let _a = n1.pod();
    wait_until("n1's no-masquerade set to fill", SETTLE, || {
        no_masq_elements(n1).is_some_and(|e| !e.is_empty())
    });
    let filled = no_masq_elements(n1);
    // Several re-checks (every 2 s here) with nothing changed.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(no_masq_elements(n1), filled);
    let set = flatnet_datapath::masquerade::no_masq_set(&n1.network, true);
    n1.netns
        .exec(&["nft", "flush", "set", "inet", "flatnet", &set]);
    wait_until("the flushed set to be filled again", SETTLE, || {
        no_masq_elements(n1) == filled
    });
}

#[flatnet_test(root)]
fn uninstall_takes_the_agents_setup_away_and_pods_keep_talking() {
    let cluster = Cluster::with_file_agents_flagged(2, &["--ip-masq", "true"]);
    let n1 = cluster.node("n1");
    let a = n1.pod();
    let a2 = n1.pod();
    wait_until("n1's no-masquerade set to fill", SETTLE, || {
        no_masq_elements(n1).is_some_and(|e| !e.is_empty())
    });
    assert!(uplink_program_attached(n1));
    let managed = flatnet_datapath::node::markers::managed_marker(&n1.network);
    assert!(managed.exists());
    // `--routing auto` (the default) keeps a VXLAN device for peers off
    // this node's subnets.
    assert!(n1.has_link("flatnet.vxlan"));

    // As the uninstall DaemonSet does it: the agent gone first.
    n1.stop_agent();
    assert!(n1.uninstall(), "uninstall failed:\n{}", n1.agent_log());
    assert!(!n1.conflist_path().exists(), "conflist left");
    assert!(!n1.ready_marker().exists(), "ready marker left");
    assert!(!managed.exists(), "managed marker left");
    assert_eq!(n1.routes(), Vec::<String>::new());
    assert_eq!(n1.remote_cidrs(), Vec::<String>::new());
    assert!(!uplink_program_attached(n1), "from_uplink still attached");
    assert!(!n1.has_link("flatnet.vxlan"), "VXLAN device left");
    // The pods' masquerade rules stay while they live; their sets empty.
    assert_eq!(no_masq_elements(n1), Some(Vec::new()));
    // The node's pods keep talking; a second run finds nothing to do.
    tcp_echo(Some(&a2.netns), a2.ip, Some(&a.netns), 1 << 16).expect("pod to pod after uninstall");
    assert!(
        n1.uninstall(),
        "second uninstall failed:\n{}",
        n1.agent_log()
    );
    assert!(n1.datapath().exists(), "the datapath went with pods on it");

    // The last pod's DEL takes the datapath, rules and sets away.
    drop(a);
    drop(a2);
    assert!(!n1.datapath().exists(), "pins left after the last DEL");
    let lock_file = PathBuf::from(format!("/run/flatnet/network-{}.lock", n1.network));
    assert!(!lock_file.exists(), "{} left", lock_file.display());
    assert_eq!(no_masq_elements(n1), None, "no-masquerade set left");
    let tables = n1.netns.exec(&["nft", "list", "tables"]);
    assert!(!tables.contains("flatnet"), "{tables}");

    // A conflist the agent did not write is left alone.
    std::fs::create_dir_all(n1.conflist_path().parent().unwrap()).unwrap();
    let by_hand = json!({"cniVersion": "1.0.0", "name": n1.network,
        "plugins": [{"type": "flatnet", "ipam": {"type": "flatnet-ipam", "subnet": "10.244.1.0/24"}}]});
    std::fs::write(n1.conflist_path(), by_hand.to_string()).unwrap();
    assert!(
        n1.uninstall(),
        "third uninstall failed:\n{}",
        n1.agent_log()
    );
    assert!(
        n1.conflist_path().exists(),
        "a hand-written conflist was removed"
    );
}

/// Kernel ids of the node's pinned `from_pod` and `from_uplink`: a reload
/// makes new programs, with new ids, under the same pin names.
fn program_ids(node: &SimNode) -> Vec<u32> {
    let datapath = node.datapath();
    [PROG_FROM_POD, PROG_FROM_UPLINK]
        .into_iter()
        .map(|name| {
            datapath
                .program(name)
                .and_then(|p| p.id())
                .unwrap_or_else(|e| panic!("{name} of {}: {e}", node.spec.name))
        })
        .collect()
}

#[flatnet_test(root)]
fn restarting_agents_keeps_an_established_tcp_stream() {
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    let a = n1.pod();
    let b = n2.pod();
    let routes_before = (n1.routes(), n2.routes());
    let programs_before = program_ids(n1);
    let fast_before = n1.packets(action::TO_REMOTE_NODE);
    let mut fast_while_down = 0;
    let (sent, received) = stream_during(&b.netns, b.ip, &a.netns, || {
        for node in [n1, n2] {
            node.stop_agent();
            // Agent gone: STATUS says the node cannot take pods (50)...
            let status = node.cni("STATUS", None);
            status.assert_error(50, "agent");
            // ...while the pinned datapath keeps carrying the stream.
            let counted = node.packets(action::TO_REMOTE_NODE);
            // A window of the stream: the counter must grow within it.
            std::thread::sleep(Duration::from_millis(300));
            fast_while_down += node.packets(action::TO_REMOTE_NODE) - counted;
            node.start_agent(&cluster.file());
            node.wait_ready();
        }
    });
    assert_eq!(sent, received, "bytes were lost across agent restarts");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");
    assert!(fast_while_down > 0, "the fast path stopped with the agent");
    assert!(n1.packets(action::TO_REMOTE_NODE) > fast_before);
    assert_eq!((n1.routes(), n2.routes()), routes_before);
    for node in [n1, n2] {
        assert!(node.cni("STATUS", None).success());
    }
    // And the datapath was not reloaded: the very programs of before.
    assert_eq!(program_ids(n1), programs_before);
}

/// One datapath build per node, the agent's. An agent of another build
/// (its programs pinned under their own build id) meets a plugin of this
/// build: the plugin's ADD refuses to pin its programs over the agent's,
/// saying which builds meet, and leaves nothing behind. The rolling
/// upgrade (an agent of the plugin's build starting) loads its own build,
/// moves the running pods onto it and retires the other; ADD works again.
#[flatnet_test(root)]
fn a_plugin_of_another_build_never_replaces_the_agents_datapath() {
    const OTHER_BUILD: &str = "0123456789ab";
    let cluster = Cluster::with_file_agents(1);
    let n1 = cluster.node("n1");
    let a = n1.pod();
    // The agent of "another build": its programs pinned under that id.
    n1.stop_agent();
    let pins = n1.datapath().pin_dir().to_path_buf();
    let own = format!("-{}", flatnet_datapath::bpf::DATAPATH_ID);
    for entry in std::fs::read_dir(&pins).expect("pins").flatten() {
        let name = entry.file_name().into_string().expect("a pin name");
        if let Some(program) = name.strip_suffix(&own) {
            std::fs::rename(entry.path(), pins.join(format!("{program}-{OTHER_BUILD}")))
                .expect("re-pin under the other build's id");
        }
    }
    let links_before = run_ok(Command::new("ip").args(["-n", &n1.netns.name, "-o", "link"]));
    let netns = Netns::new();
    let out = n1.cni("ADD", Some(("ctr-other-build", &netns.path())));
    out.assert_error(101, OTHER_BUILD);
    out.assert_error(101, flatnet_datapath::bpf::DATAPATH_ID);
    // Nothing of the failed ADD is left, and the other build stays pinned.
    let links_after = run_ok(Command::new("ip").args(["-n", &n1.netns.name, "-o", "link"]));
    assert_eq!(
        links_after.lines().count(),
        links_before.lines().count(),
        "{links_after}"
    );
    assert_eq!(
        n1.datapath().other_pinned_build().as_deref(),
        Some(OTHER_BUILD)
    );
    // The rolling upgrade: the agent of this build starts.
    n1.start_agent(&cluster.file());
    n1.wait_ready();
    assert_eq!(n1.datapath().other_pinned_build(), None);
    assert!(
        !std::fs::read_dir(&pins)
            .expect("pins")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(OTHER_BUILD)),
        "the other build's programs were not retired"
    );
    let b = n1.pod_in(netns, "");
    tcp_echo(Some(&a.netns), a.ip, Some(&b.netns), 100_000).expect("b -> a after the upgrade");
}

#[flatnet_test(root)]
fn a_moved_pin_root_travels_in_the_conflist_and_cannot_split_the_datapath() {
    // The agents pin under the test's own bpffs, not /sys/fs/bpf/flatnet;
    // the plugin runs with the CNI variables only, as a runtime runs it.
    let cluster = Cluster::with_file_agents(2);
    let (n1, n2) = (cluster.node("n1"), cluster.node("n2"));
    assert_eq!(
        n1.conflist()["plugins"][0]["pinRoot"],
        n1.pin_root.display().to_string()
    );
    let a = n1.pod();
    let b = n2.pod();
    // The pods' entries are in the maps the agents' uplink programs read.
    for (node, pod) in [(n1, &a), (n2, &b)] {
        let endpoint = node.datapath().endpoint(pod.ip.into()).expect("endpoint");
        assert!(
            endpoint.is_some(),
            "{} is not in {}'s maps",
            pod.ip,
            node.spec.name
        );
    }
    let (out, delivered) = (
        n1.bytes(action::TO_REMOTE_NODE),
        n2.bytes(action::FROM_UPLINK),
    );
    tcp_echo(Some(&b.netns), b.ip, Some(&a.netns), 1 << 20).expect("n1 -> n2");
    // 1 MiB out to b and 1 MiB of echo back in (headers on top).
    assert!(n1.bytes(action::TO_REMOTE_NODE) - out > (1 << 20) * 49 / 50);
    assert!(n2.bytes(action::FROM_UPLINK) - delivered > (1 << 20) * 49 / 50);
    // A plugin told to pin elsewhere is refused, and makes nothing.
    let netns = Netns::new();
    let elsewhere = std::path::Path::new("/sys/fs/bpf/flatnet-elsewhere");
    let out = n1.cni_with_env(
        "ADD",
        Some(("split", &netns.path())),
        &[("FLATNET_PIN_ROOT", elsewhere)],
    );
    out.assert_error(7, "disagrees with the configuration's \"pinRoot\"");
    assert!(!elsewhere.exists(), "the refused ADD pinned something");
}

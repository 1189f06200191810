//! Attachment through tcx: each program on a pinned BPF link (what
//! `bpftool net` and `bpftool link` show; ADD puts a cls_bpf filter on and
//! moves it to its link after the answer), links replaced, never stacked,
//! when an ADD or that move is killed half way, a node attached the old
//! way (netlink cls_bpf filters) moved to tcx under a live TCP stream, and
//! XDP mode on XDP links.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flatnet_common::{PROG_FROM_POD, PROG_FROM_POD_XDP, PROG_POD_XDP_PASS, PROG_TO_POD};
use flatnet_datapath::bpf::{ATTACH_ENV, LinkRole};
use flatnet_tests::*;
use serde_json::{Value, json};

/// The BPF links of the kernel on device `ifindex`, as `bpftool link` lists
/// them: (type, attach type).
fn links_on(ifindex: u32) -> Vec<(String, String)> {
    let out = bpftool_ok(Command::new("bpftool").args(["-j", "link", "show"]));
    let listed: Value = serde_json::from_str(&out).expect("bpftool's JSON");
    listed
        .as_array()
        .into_iter()
        .flatten()
        .filter(|link| link["ifindex"].as_u64() == Some(u64::from(ifindex)))
        .map(|link| {
            (
                link["type"].as_str().unwrap_or_default().to_string(),
                link["attach_type"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn ifindex(dev: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/ifindex"))
        .expect("the device's ifindex")
        .trim()
        .parse()
        .expect("an ifindex")
}

fn link_pin(net: &Network, role: LinkRole, dev: &str) -> PathBuf {
    net.datapath().link_path(role, dev)
}

/// Waits for ADD's move to tcx (after its answer), then checks it: no
/// cls_bpf filter left (the clsact qdisc stays, empty: deleting it would
/// drop what the stack sends into the pod meanwhile, see `tcx_move`).
fn wait_for_one_tcx_link(net: &Network, dev: &str) {
    wait_for_tcx(dev);
    assert_one_tcx_link(net, dev);
    for hook in ["ingress", "egress"] {
        let filters = run_ok(Command::new("tc").args(["filter", "show", "dev", dev, hook]));
        assert!(filters.trim().is_empty(), "{dev} {hook}: {filters}");
    }
}

/// Exactly flatnet's two programs at `dev`'s hooks, each on a pinned tcx
/// link: `from_pod` at ingress, `to_pod` at egress.
fn assert_one_tcx_link(net: &Network, dev: &str) {
    let hooks = tc_hooks(dev);
    let mut seen: Vec<_> = hooks
        .iter()
        .map(|h| (h.kind.as_str(), h.program.as_str(), h.link_id.is_some()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("tcx/egress", "to_pod", true),
            ("tcx/ingress", "from_pod", true)
        ],
        "{dev}: {hooks:?}"
    );
    let mut links = links_on(ifindex(dev));
    links.sort();
    assert_eq!(
        links,
        vec![
            ("tcx".to_string(), "tcx_egress".to_string()),
            ("tcx".to_string(), "tcx_ingress".to_string())
        ],
        "{dev}: bpftool link"
    );
    for role in [LinkRole::HostVeth, LinkRole::ToPod] {
        assert!(link_pin(net, role, dev).exists(), "{dev}: no {role:?} pin");
    }
}

#[flatnet_test(root)]
fn every_pod_program_is_on_a_pinned_tcx_link_that_del_removes() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    for pod in [&a, &b] {
        // No qdisc of flatnet's left: the hook belongs to tcx.
        wait_for_one_tcx_link(&net, &pod.host_veth());
    }
    let inspect = run_ok(Command::new(bin("flatnet")).args(["inspect", "--network", &net.name]));
    assert!(inspect.contains("attached: tcx"), "{inspect}");

    let before = net.redirected_bytes();
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 256 << 10).expect("a -> b");
    assert!(net.redirected_bytes() > before + (256 << 10));

    let (veth, index) = (a.host_veth(), ifindex(&a.host_veth()));
    drop(a);
    // The reaper unpins once it has deleted the veth (after DEL's answer).
    wait_until("the link's pin to go", Duration::from_secs(10), || {
        !link_pin(&net, LinkRole::HostVeth, &veth).exists()
    });
    wait_until(
        "the link to go with its pin",
        Duration::from_secs(10),
        || links_on(index).is_empty(),
    );
}

/// Crashes around the attachment, then what comes next, and after it
/// exactly one flatnet program on the hook, on a pinned tcx link:
/// - ADD killed once the program is on the veth (the quick way, a cls_bpf
///   filter) and before the maps are written: the runtime's retry of the
///   same attachment (flatnet-ipam hands it the same address);
/// - the move to tcx after the answer killed before its link is pinned
///   (the link dies with the process; the filter stays, and works) or
///   after (link and filter both): `flatnet repair`.
#[flatnet_test(root)]
fn crashes_around_the_attachment_leave_one_program_on_the_hook() {
    let net = Network::flatnet_ipam();
    let peer = net.pod();
    let conflist = std::env::temp_dir().join(format!("{}.conf", unique("tcx-")));
    std::fs::write(&conflist, net.conf.to_string()).expect("writing the config");
    let filters = [
        TcHook {
            kind: "clsact/ingress".into(),
            program: "from_pod".into(),
            program_id: net.datapath().program(PROG_FROM_POD).unwrap().id().unwrap(),
            link_id: None,
        },
        TcHook {
            kind: "clsact/egress".into(),
            program: "to_pod".into(),
            program_id: net.datapath().program(PROG_TO_POD).unwrap().id().unwrap(),
            link_id: None,
        },
    ];
    for stage in [
        "datapath attached",
        "tcx link made, not pinned yet",
        "tcx link pinned",
    ] {
        let netns = Netns::new();
        let id = unique("ctr-");
        let marker = unique("mark-");
        let mut call = CniCall::new("ADD", &id, &netns.path(), "eth0");
        call.env.push(("FLATNET_KILL_AFTER".into(), stage.into()));
        call.env
            .push(("FLATNET_TEST_MARK".into(), marker.clone().into()));
        let added = call
            .spawn(&bin("flatnet"), &net.stdin())
            .wait_with_output()
            .expect("waiting for the ADD");
        // The move runs in a child the ADD leaves behind: wait for it.
        wait_until(
            "the ADD's processes to end",
            Duration::from_secs(10),
            || processes_marked(&marker) == 0,
        );
        let veth = net.host_veth(&id, "eth0");
        let expected_links = usize::from(stage == "tcx link pinned");
        if stage != "datapath attached" {
            // A killed process's environment goes (exit_mm) before its
            // files are closed (exit_files), so its unpinned link can
            // outlive the wait above by a moment: wait for the close.
            wait_until(
                "the killed mover's unpinned link to close",
                Duration::from_secs(10),
                || links_on_hook(&veth) == expected_links,
            );
        }
        let hooks = tc_hooks(&veth);
        let result = if stage == "datapath attached" {
            assert_eq!(added.status.signal(), Some(9), "{stage}: not killed");
            assert_eq!(hooks, filters, "{stage}");
            let retry =
                CniCall::new("ADD", &id, &netns.path(), "eth0").run(&bin("flatnet"), &net.stdin());
            assert!(retry.success(), "{stage}: retry: {retry:?}");
            retry.json()
        } else {
            assert!(added.status.success(), "{stage}: the ADD itself failed");
            assert_eq!(links_on_hook(&veth), expected_links, "{stage}: {hooks:?}");
            assert!(
                filters.iter().all(|filter| hooks.contains(filter)),
                "{stage}: a filter is gone: {hooks:?}"
            );
            let out = run_ok(
                Command::new(bin("flatnet"))
                    .arg("repair")
                    .arg("--conf")
                    .arg(&conflist),
            );
            assert!(out.contains("pod(s) attached"), "{out}");
            serde_json::from_slice(&added.stdout).expect("the ADD's result")
        };
        wait_for_one_tcx_link(&net, &veth);
        let pod = Pod {
            network: &net,
            netns,
            container_id: id,
            ifname: "eth0".into(),
            result,
        };
        let before = net.redirected_bytes();
        tcp_echo(Some(&peer.netns), peer.ip(), Some(&pod.netns), 128 << 10)
            .unwrap_or_else(|e| panic!("{stage}: pod -> peer afterwards: {e}"));
        assert!(net.redirected_bytes() > before + (128 << 10), "{stage}");
    }
    let _ = std::fs::remove_file(&conflist);
}

/// How many of the veth's tc hooks are tcx links (not cls_bpf filters).
fn links_on_hook(veth: &str) -> usize {
    tc_hooks(veth)
        .iter()
        .filter(|hook| hook.link_id.is_some())
        .count()
}

/// Processes whose environment carries `FLATNET_TEST_MARK=<marker>`.
fn processes_marked(marker: &str) -> usize {
    let needle = format!("FLATNET_TEST_MARK={marker}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read(entry.path().join("environ")).ok())
        .filter(|environ| {
            environ
                .split(|byte| *byte == 0)
                .any(|var| var == needle.as_bytes())
        })
        .count()
}

/// A node whose pods were attached the old way (cls_bpf filters on clsact,
/// as flatnet did before tcx) is moved to tcx by `flatnet repair` (what an
/// upgrade's first ADD does too) while a TCP stream runs between two pods:
/// not a byte lost, no reset, and every pod on one tcx link afterwards.
#[flatnet_test(root)]
fn a_node_attached_with_filters_moves_to_tcx_under_a_live_stream() {
    let net = Network::host_local();
    let pods: Vec<Pod> = (0..2)
        .map(|_| {
            let netns = Netns::new();
            let id = unique("ctr-");
            let mut call = CniCall::new("ADD", &id, &netns.path(), "eth0");
            call.env.push((ATTACH_ENV.into(), "netlink".into()));
            let out = call.run(&bin("flatnet"), &net.stdin());
            assert!(out.success(), "ADD the old way: {out:?}");
            Pod {
                network: &net,
                netns,
                container_id: id,
                ifname: "eth0".into(),
                result: out.json(),
            }
        })
        .collect();
    let (a, b) = (&pods[0], &pods[1]);
    for pod in &pods {
        let hooks = tc_hooks(&pod.host_veth());
        let seen: Vec<_> = hooks
            .iter()
            .map(|h| (h.kind.as_str(), h.program.as_str(), h.link_id))
            .collect();
        assert_eq!(
            seen,
            [
                ("clsact/ingress", "from_pod", None),
                ("clsact/egress", "to_pod", None)
            ],
            "attached the old way"
        );
    }
    let conflist = std::env::temp_dir().join(format!("{}.conf", unique("tcx-")));
    std::fs::write(&conflist, net.conf.to_string()).expect("writing the config");
    let retransmitted_before = retransmitted_segments(&a.netns);
    let redirected_before = net.redirected_bytes();
    let (sent, received) = stream_during(&b.netns, b.ip(), &a.netns, || {
        let out = run_ok(
            Command::new(bin("flatnet"))
                .arg("repair")
                .arg("--conf")
                .arg(&conflist),
        );
        assert!(out.contains("2 pod(s) attached"), "{out}");
    });
    let _ = std::fs::remove_file(&conflist);
    let retransmitted = retransmitted_segments(&a.netns) - retransmitted_before;
    eprintln!(
        "stream across the move: {sent} bytes sent, {received} received, {retransmitted} segments retransmitted"
    );
    assert_eq!(sent, received, "bytes were lost moving to tcx");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");
    assert!(
        net.redirected_bytes() - redirected_before >= sent,
        "the stream left the fast path"
    );
    for pod in &pods {
        wait_for_one_tcx_link(&net, &pod.host_veth());
    }
}

/// TCP segments the namespace's stack retransmitted (/proc/net/snmp).
fn retransmitted_segments(netns: &Netns) -> u64 {
    let snmp = netns.exec(&["cat", "/proc/net/snmp"]);
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "RetransSegs")
        .and_then(|(_, value)| value.parse().ok())
        .expect("RetransSegs in /proc/net/snmp")
}

/// XDP mode: the host veth's program and the pod side's `pod_xdp_pass`
/// on XDP links, pinned, and `from_pod_passed` behind the XDP program at
/// the host veth's ingress and `to_pod` at its egress on their tcx links
/// (cls_bpf filters until ADD's work after the answer moves them); DEL
/// takes the pins.
#[flatnet_test(root)]
fn xdp_mode_attaches_through_pinned_xdp_links() {
    let mut net = Network::host_local();
    net.conf["datapath"] = json!("xdp");
    let a = net.pod();
    let b = net.pod();
    let datapath = net.datapath();
    let id_of = |program: &str| datapath.program(program).unwrap().id().unwrap();
    let (from_pod_xdp, pod_xdp_pass) = (id_of(PROG_FROM_POD_XDP), id_of(PROG_POD_XDP_PASS));
    for pod in [&a, &b] {
        let veth = pod.host_veth();
        wait_until(
            &format!("{veth}'s tc programs to move to their tcx links"),
            Duration::from_secs(10),
            || tc_hooks(&veth).iter().all(|hook| hook.link_id.is_some()),
        );
        assert_eq!(
            links_on(ifindex(&veth)),
            vec![
                ("xdp".to_string(), String::new()),
                ("tcx".to_string(), "tcx_ingress".to_string()),
                ("tcx".to_string(), "tcx_egress".to_string())
            ],
            "{veth}: bpftool link"
        );
        assert!(link_pin(&net, LinkRole::ToPod, &veth).exists());
        assert!(link_pin(&net, LinkRole::Passed, &veth).exists());
        let listed = bpftool_ok(Command::new("bpftool").args(["net", "show", "dev", &veth]));
        assert!(listed.contains(&format!("id {from_pod_xdp}")), "{listed}");
        assert!(link_pin(&net, LinkRole::HostVeth, &veth).exists());
        assert!(link_pin(&net, LinkRole::PodSide, &veth).exists());
        let inside = bpftool_ok(
            &mut pod
                .netns
                .command(&["bpftool", "net", "show", "dev", "eth0"]),
        );
        assert!(inside.contains(&format!("id {pod_xdp_pass}")), "{inside}");
    }
    let before = net.redirected_bytes();
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 256 << 10).expect("a -> b");
    assert!(net.redirected_bytes() > before + (256 << 10));
    let veth = a.host_veth();
    drop(a);
    for role in [
        LinkRole::HostVeth,
        LinkRole::PodSide,
        LinkRole::ToPod,
        LinkRole::Passed,
    ] {
        wait_until(
            &format!("the {role:?} pin to go"),
            Duration::from_secs(10),
            || !link_pin(&net, role, &veth).exists(),
        );
    }
}

/// ADD's work after its answer and the agent writing the pod's policy may
/// make the pod's `to_pod` link at the same moment, from two processes:
/// both succeed, and the hook holds one link, pinned.
#[flatnet_test(root)]
fn two_makers_of_the_same_link_at_once_leave_one() {
    let net = Network::host_local();
    let pod = net.pod();
    let dev = pod.host_veth();
    wait_for_one_tcx_link(&net, &dev);
    for round in 0..20 {
        // The link gone (as on a node whose pods predate to_pod): each
        // round starts where neither maker finds a pin.
        std::fs::remove_file(link_pin(&net, LinkRole::ToPod, &dev)).expect("unpinning");
        wait_until("to_pod off the hook", Duration::from_secs(5), || {
            links_on(ifindex(&dev)).len() == 1
        });
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let datapath = net.datapath();
                    barrier.wait();
                    datapath
                        .attach_tc_link(PROG_TO_POD, LinkRole::ToPod, &dev)
                        .unwrap_or_else(|e| panic!("round {round}: {e}"));
                });
            }
        });
        assert_one_tcx_link(&net, &dev);
    }
}

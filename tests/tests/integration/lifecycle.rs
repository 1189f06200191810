//! The datapath's life across builds and accidents: an upgrade replaces the
//! program under a live TCP stream, a wiped pin directory is rebuilt from
//! the pods that exist, a load killed half-way does not keep a killed
//! ADD's address, and `flatnet inspect` shows what is there.

use std::process::Command;

use flatnet::config::DatapathMode;
use flatnet_common::{
    MAP_ENDPOINTS_V4, MAP_ENDPOINTS_V6, MAP_LOCAL_ADDRS, MAP_PEER_IDS_V4, MAP_PEER_IDS_V6,
    MAP_POD_SOURCES, MAP_POLICY_DROPS, MAP_POLICY_EVENTS, MAP_POLICY_FLOWS, MAP_POLICY_PEERS,
    MAP_POLICY_PODS, MAP_POLICY_V4, MAP_POLICY_V6, PROG_FROM_POD, SOURCES_F_VALID, action,
};
use flatnet_datapath::bpf::DATAPATH_ID;
use flatnet_tests::*;

/// IDs of the programs at tc ingress of a host interface: tcx links and
/// cls_bpf filters alike.
fn attached_ids(link: &str) -> Vec<u32> {
    tc_hooks(link)
        .into_iter()
        .filter(|hook| hook.kind.ends_with("ingress"))
        .map(|hook| hook.program_id)
        .collect()
}

#[flatnet_test(root)]
fn a_tcp_stream_survives_an_upgrade_of_the_datapath() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    let datapath = net.datapath();
    let old_id = datapath.program(PROG_FROM_POD).unwrap().id().unwrap();
    wait_for_tcx(&a.host_veth());
    wait_for_tcx(&b.host_veth());
    assert_eq!(attached_ids(&a.host_veth()), vec![old_id]);
    // Make the running program look like an older build's: the next ADD
    // then loads this build's anew and moves every veth over to it, which
    // is exactly what a plugin upgrade does.
    let pinned = datapath.program_path(PROG_FROM_POD);
    let older = pinned.with_file_name(format!("{PROG_FROM_POD}-000000000000"));
    std::fs::rename(&pinned, &older).unwrap();
    assert!(!datapath.is_loaded(DatapathMode::Tc));
    // Builds before the source check had no POD_SOURCES: the upgrade must
    // fill a new one for the pods already there, or their packets drop.
    std::fs::remove_file(datapath.map_path(MAP_POD_SOURCES)).unwrap();
    // Nor the NetworkPolicy maps (nor the drop events' ring buffer): the
    // upgrade makes them, empty.
    let policy_maps = [
        MAP_POLICY_EVENTS,
        MAP_POLICY_PODS,
        MAP_POLICY_V4,
        MAP_POLICY_V6,
        MAP_POLICY_FLOWS,
        MAP_POLICY_DROPS,
        MAP_LOCAL_ADDRS,
        MAP_POLICY_PEERS,
        MAP_PEER_IDS_V4,
        MAP_PEER_IDS_V6,
    ];
    for map in policy_maps {
        std::fs::remove_file(datapath.map_path(map)).unwrap();
    }

    let mut third = None;
    let (sent, received) = stream_during(&b.netns, b.ip(), &a.netns, || {
        third = Some(net.pod());
    });
    assert_eq!(sent, received, "bytes were lost across the upgrade");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");

    let new_id = datapath.program(PROG_FROM_POD).unwrap().id().unwrap();
    assert_ne!(new_id, old_id, "no new program was loaded");
    for veth in [a.host_veth(), b.host_veth()] {
        assert_eq!(
            attached_ids(&veth),
            vec![new_id],
            "{veth} still runs the old program"
        );
    }
    assert!(!older.exists(), "the old program's pin was kept");
    for map in policy_maps {
        assert!(datapath.map_path(map).exists(), "{map} was not made");
    }
    // The new POD_SOURCES holds the pods that were there before it.
    for pod in [&a, &b] {
        let slot = datapath
            .endpoint(pod.ip().into())
            .unwrap()
            .expect("endpoint")
            .counter_slot;
        let sources = datapath.sources(slot).unwrap();
        assert_eq!(sources.flags & SOURCES_F_VALID, SOURCES_F_VALID);
        assert_eq!(sources.v4[0], pod.ip().octets());
    }
    assert!(
        datapath
            .program_path(PROG_FROM_POD)
            .ends_with(format!("{PROG_FROM_POD}-{DATAPATH_ID}"))
    );
    drop(third);
}

#[flatnet_test(root)]
fn a_wiped_pin_directory_is_rebuilt_by_the_next_add() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    for pod in [&a, &b] {
        wait_for_tcx(&pod.host_veth());
    }
    // What a bpffs remount does to us: pins gone. The pinned tcx links
    // held the programs on the veths, so they are gone too (a netlink
    // filter would have outlived its pin): the pods have no datapath until
    // the next ADD, `flatnet repair` or the agent's next resync.
    std::fs::remove_dir_all(net.datapath().pin_dir()).unwrap();
    // A link goes once its last reference does: the pin's at once, a
    // process's fd (the deferred move to tcx after an ADD) when it exits;
    // CI saw one still attached right after the unlink.
    for pod in [&a, &b] {
        wait_until(
            "the pod's tcx link to go with its pin",
            std::time::Duration::from_secs(5),
            || attached_ids(&pod.host_veth()).is_empty(),
        );
    }

    let c = net.pod();
    let datapath = net.datapath();
    for pod in [&a, &b, &c] {
        let endpoint = datapath
            .endpoint(pod.ip().into())
            .unwrap()
            .unwrap_or_else(|| panic!("{} not rebuilt", pod.ip()));
        assert_eq!(endpoint.pod_mac.to_vec(), mac_of(&pod.netns));
    }
    let before = net.redirected_bytes();
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 256 << 10).expect("a -> b after the rebuild");
    tcp_echo(Some(&a.netns), a.ip(), Some(&c.netns), 256 << 10).expect("c -> a after the rebuild");
    // 256 KiB each way, twice.
    assert!(
        net.redirected_bytes() >= before + (1 << 20),
        "traffic does not go through the rebuilt datapath"
    );
    let new_id = datapath.program(PROG_FROM_POD).unwrap().id().unwrap();
    assert_eq!(attached_ids(&a.host_veth()), vec![new_id]);
}

/// A runtime that SIGKILLs an ADD while it pins the datapath (critest's
/// killed-ADD rounds under containerd 2 did) leaves some maps pinned and
/// others not, and the address IPAM gave the ADD. The DEL the runtime then
/// sends must give the address back: before, it stopped at the first map
/// it could not open (CNI error 101) and the address stayed taken.
#[flatnet_test(root)]
fn del_after_a_load_killed_half_way_gives_the_address_back() {
    let net = Network::flatnet_ipam();
    let first = net.pod();
    // What a load killed before the address maps were pinned leaves.
    let datapath = net.datapath();
    for map in [MAP_ENDPOINTS_V4, MAP_ENDPOINTS_V6] {
        let _ = std::fs::remove_file(datapath.map_path(map));
    }
    // The killed ADD got as far as IPAM.
    let netns = Netns::new();
    let container = unique("ctr-");
    let ipam = CniCall::new("ADD", &container, &netns.path(), "eth0")
        .run(&bin("flatnet-ipam"), &net.stdin());
    assert!(ipam.success(), "IPAM ADD: {ipam:?}");
    let address = ipam.json()["ips"][0]["address"]
        .as_str()
        .and_then(|cidr| cidr.split('/').next())
        .unwrap()
        .to_string();
    assert!(net.ipam_allocations().contains(&address));
    // The runtime's clean-up: DEL without prevResult (the ADD gave none).
    let del = net.call("DEL", &container, &netns.path(), "eth0");
    assert!(del.success(), "DEL after a killed load: {del:?}");
    assert!(
        !net.ipam_allocations().contains(&address),
        "{address} still allocated after DEL"
    );
    drop(first);
}

#[flatnet_test(root)]
fn flatnet_repair_rebuilds_a_wiped_network() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    std::fs::remove_dir_all(net.datapath().pin_dir()).unwrap();
    let conf = std::env::temp_dir().join(format!("flatnet-repair-{}.json", net.name));
    std::fs::write(&conf, net.conf.to_string()).unwrap();
    let out = Command::new(bin("flatnet"))
        .arg("repair")
        .arg("--conf")
        .arg(&conf)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&conf);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 pod(s) attached"),
        "{out:?}"
    );
    for pod in [&a, &b] {
        let check = CniCall::new("CHECK", &pod.container_id, &pod.netns.path(), "eth0")
            .run(&bin("flatnet"), &pod.stdin_with_prev_result());
        assert!(check.success(), "{check:?}");
    }
}

#[flatnet_test(root)]
fn inspect_shows_pods_counters_and_programs() {
    let net = Network::host_local();
    let a = net.pod();
    let b = net.pod();
    tcp_echo(Some(&b.netns), b.ip(), Some(&a.netns), 256 << 10).expect("a -> b");
    let out = Command::new(bin("flatnet"))
        .args(["inspect", "--json", "--network", &net.name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = &reports[0];
    assert_eq!(report["network"], net.name.as_str());
    assert_eq!(report["datapath"], "tc");
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2);
    for (pod, json) in [(&a, &pods[0]), (&b, &pods[1])] {
        assert_eq!(json["addresses"][0], pod.ip().to_string());
        assert_eq!(json["host_veth"], pod.host_veth().as_str());
        assert_eq!(json["current_program"], true);
        assert!(json["tx"]["packets"].as_u64().unwrap() > 10, "{json}");
        assert!(json["rx"]["packets"].as_u64().unwrap() > 10, "{json}");
    }
    assert!(
        report["counters"][action::NAMES[action::REDIRECTED as usize]]["packets"]
            .as_u64()
            .unwrap()
            > 20
    );
    let text = run_ok(Command::new(bin("flatnet")).args(["inspect", "--network", &net.name]));
    assert!(
        text.contains("POD ADDRESSES")
            && text.contains(&a.host_veth())
            && text.contains(&b.ip().to_string()),
        "{text}"
    );
}

#[flatnet_test(root)]
fn per_pod_counters_are_removed_with_the_pod() {
    let net = Network::host_local();
    let keep = net.pod();
    let pod = net.pod();
    let index_of = |pod: &Pod| -> u32 {
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", pod.host_veth()))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (index, keep_index) = (index_of(&pod), index_of(&keep));
    let slot_of = |index: u32| {
        net.datapath()
            .host_veths()
            .unwrap()
            .into_iter()
            .find(|(i, _)| *i == index)
            .map(|(_, ep)| ep.counter_slot)
    };
    let (slot, keep_slot) = (slot_of(index).unwrap(), slot_of(keep_index).unwrap());
    assert_ne!(slot, flatnet_common::NO_COUNTER_SLOT);
    assert_ne!(slot, keep_slot, "two pods share a counter slot");
    // The program finds the sender's slot from the veth's ifindex: the
    // slot's source entry names the veth.
    assert_eq!(net.datapath().sources(slot).unwrap().host_ifindex, index);
    assert_eq!(
        slot,
        flatnet_common::preferred_slot(index),
        "no collision here"
    );

    tcp_echo(Some(&pod.netns), pod.ip(), None, 64 << 10).expect("host -> pod");
    tcp_echo(Some(&keep.netns), keep.ip(), Some(&pod.netns), 64 << 10).expect("pod -> keep");
    let counters = net.datapath().slot_counters(slot).unwrap();
    assert!(
        counters.tx_packets > 0 && counters.tx_bytes > 0,
        "{counters:?}"
    );
    assert!(
        net.datapath().slot_counters(keep_slot).unwrap().rx_packets > 0,
        "redirected packets not counted for the receiver"
    );
    drop(pod);
    assert!(
        net.datapath()
            .host_veths()
            .unwrap()
            .iter()
            .all(|(i, _)| *i != index)
    );
    // The slot is free again (its claim file gone) and counts from zero
    // for whoever claims it next: the same ifindex starts the search there.
    let claims = format!("/run/flatnet/slots-{}", net.name);
    assert!(
        !std::path::Path::new(&format!("{claims}/{slot}")).exists(),
        "slot {slot} still claimed"
    );
    let datapath = net.datapath();
    assert_ne!(
        datapath.slot_counters(slot).unwrap(),
        flatnet_common::EndpointCounters::default(),
        "a freed slot keeps its counts until claimed"
    );
    let reclaimed = datapath.claim_counter_slot(index).unwrap();
    assert_eq!(reclaimed, slot);
    let fresh = datapath.slot_counters(slot).unwrap();
    datapath.release_counter_slot(slot);
    assert_eq!(fresh, flatnet_common::EndpointCounters::default());
    assert_ne!(
        net.datapath().slot_counters(keep_slot).unwrap().rx_packets,
        0,
        "zeroing a claimed slot touched another pod's"
    );
}

fn mac_of(netns: &Netns) -> Vec<u8> {
    netns
        .exec(&["cat", "/sys/class/net/eth0/address"])
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

//! An attachment no runtime knows, whose DEL never comes, is still held at
//! half the grace period and reclaimed after it, its datapath entry gone.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::cri::PodSpec;
use flatnet_tests::*;

use super::fixture::{CriNode, GRACE_SECS, RESYNC_SECS, reclaim_tools, sandbox_address, talk};

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

//! Live sandboxes keep their addresses through churn around them and 500
//! reclaim passes, and still talk.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::cri::PodSpec;
use flatnet_tests::*;

use super::fixture::{CriNode, reclaim_tools, sandbox_address, talk};

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

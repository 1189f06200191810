//! An upgrade from the policy layout before peer identities (one host
//! prefix per allowed peer pod in each pod's table, no identity maps) to
//! this build's, under traffic: the agent of this build reloads the
//! datapath and moves the tables to identities while an allowed stream
//! runs and a pod the policy denies keeps trying.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use flatnet_common::{MAP_PEER_IDS_V4, MAP_PEER_IDS_V6, MAP_POLICY_PEERS, PROG_FROM_POD};
use flatnet_datapath::bpf::{PolicyPorts, PolicyRule};
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{Kind, ServedStub, api_app_pod, api_namespace};
use flatnet_tests::*;
use serde_json::json;

/// Tries TCP connections from `from` to `to` every 100 ms until stopped;
/// counts the ones that got through.
fn keep_trying(
    from: &Netns,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
) -> (std::thread::JoinHandle<()>, Arc<AtomicU32>) {
    let through = Arc::new(AtomicU32::new(0));
    let path = from.path();
    let counted = through.clone();
    let handle = std::thread::spawn(move || {
        enter_thread(&path).expect("enter the prober's namespace");
        while !stop.load(Ordering::Relaxed) {
            if TcpStream::connect_timeout(&to, Duration::from_millis(300)).is_ok() {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (handle, through)
}

#[flatnet_test(root)]
fn policy_moves_to_peer_identities_under_traffic_without_opening_or_dropping() {
    let cluster = Cluster::new(&specs(&[("cp-1", 1, Some("10.244.0.0/24"))]));
    let node = cluster.node("cp-1");
    let served = ServedStub::start_in(&node.netns);
    let stub = &served.stub;
    stub.add(Kind::Namespace, api_namespace("shop", json!({})));
    node.start_agent(&Peers::Api(served.url.clone()));
    node.wait_ready();
    let (web, client, stranger) = (node.pod(), node.pod(), node.pod());
    stub.add(
        Kind::Pod,
        api_app_pod("shop", "web", "cp-1", IpAddr::V4(web.ip), "web"),
    );
    stub.add(
        Kind::Pod,
        api_app_pod("shop", "client", "cp-1", IpAddr::V4(client.ip), "client"),
    );
    stub.add(
        Kind::Pod,
        api_app_pod("shop", "stranger", "cp-1", IpAddr::V4(stranger.ip), "other"),
    );
    stub.add(
        Kind::NetworkPolicy,
        json!({"metadata": {"namespace": "shop", "name": "web-from-clients"},
               "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]}}),
    );
    let datapath = node.datapath();
    let slot = datapath
        .slot_of(IpAddr::V4(web.ip))
        .unwrap()
        .expect("web's slot");
    let client_ip = IpAddr::V4(client.ip);
    wait_until("the client's identity written", SETTLE, || {
        datapath.peer_ids().unwrap().contains_key(&client_ip)
            && datapath.pod_policy_peers(slot).unwrap().len() == 1
    });

    // The node as the agent before identities left it: web's table names
    // the client's address, the identity maps do not exist, and the
    // pinned programs are another build's.
    node.stop_agent();
    let old_table = [PolicyRule {
        cidr: format!("{}/32", client.ip).parse().unwrap(),
        ports: PolicyPorts::Any,
    }];
    node.netns
        .run(|| datapath.set_pod_policy(slot, Some(&old_table), None))
        .unwrap();
    datapath.remove_peer_ids(&[client_ip]).unwrap();
    for map in [MAP_POLICY_PEERS, MAP_PEER_IDS_V4, MAP_PEER_IDS_V6] {
        std::fs::remove_file(datapath.map_path(map)).unwrap();
    }
    let old_id = datapath.program(PROG_FROM_POD).unwrap().id().unwrap();
    let pinned = datapath.program_path(PROG_FROM_POD);
    let older = pinned.with_file_name(format!("{PROG_FROM_POD}-000000000000"));
    std::fs::rename(&pinned, &older).unwrap();

    let probed = web.netns.run(|| TcpListener::bind((web.ip, 0))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (prober, through) =
        keep_trying(&stranger.netns, probed.local_addr().unwrap(), stop.clone());
    let (sent, received) = stream_during(&web.netns, web.ip, &client.netns, || {
        node.start_agent(&Peers::Api(served.url.clone()));
        node.wait_ready();
        wait_until("web's table moved to identities", SETTLE, || {
            datapath.has_peer_ids()
                && datapath.peer_ids().unwrap().contains_key(&client_ip)
                && datapath.pod_policy_rules(slot).unwrap().is_empty()
                && datapath.pod_policy_peers(slot).unwrap().len() == 1
        });
    });
    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
    assert_eq!(sent, received, "bytes were lost across the upgrade");
    assert!(sent > 1 << 20, "the stream barely moved: {sent} bytes");
    assert_eq!(
        through.load(Ordering::Relaxed),
        0,
        "the denied pod got through"
    );
    let new_id = datapath.program(PROG_FROM_POD).unwrap().id().unwrap();
    assert_ne!(new_id, old_id, "no new program was loaded");
    // Still denied, still allowed, once it is all done.
    assert!(tcp_echo(Some(&web.netns), web.ip, Some(&client.netns), 1 << 12).is_ok());
    assert!(tcp_echo(Some(&web.netns), web.ip, Some(&stranger.netns), 1 << 12).is_err());
    node.stop_agent();
    drop((web, client, stranger));
    drop(served);
}
